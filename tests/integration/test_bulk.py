"""Bulk actions by filter (issue 34): a dry run says how many and which and changes nothing;
the operation is one audited row whose items a worker applies once each, even when it is
killed halfway; a bulk reject decides every pending approval as its approver would."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy import func, select, update

from models import Action, ActionAudit, ActionState, BulkItem, BulkOperation, Run, RunStatus
from pipeline.api.tokens import create_token
from pipeline.db import transaction
from pipeline.errors import InvalidInput
from pipeline.runs import bulk
from pipeline.runs.bulk_filter import BulkFilter
from pipeline.runs.decisions import Actor, decide
from pipeline.runs.retry import retry_run
from pipeline.runs.start import start_run
from tests.integration.api_fixtures import (
    AUTH,
    BUG,
    action_row,
    client,
    park_on_approval,
    person_token,
    submit_login,
)
from tests.integration.conftest import ProcessFactory, Services, opened_pulls
from tests.support import nightshift, run_row, wait_for, wait_for_status

REPORT = ("nightly_report", {"team": "ops", "date": "2026-11-29"})
DONE = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
ECHO = "tests.fixture_agents:ECHO"
APPROVAL_ONLY = "tests.fixture_agents:APPROVAL_ONLY"
LEAD = "lead@example.com"


def _ended(run_ids: list[uuid.UUID], status: RunStatus, reason: str, hours_ago: float) -> None:
    """As a night leaves them: ended with a reason, started some hours ago."""
    with transaction() as session:
        session.execute(
            update(Run)
            .where(Run.id.in_(run_ids))
            .values(status=status, stop_reason=reason,
                    created_at=func.now() - timedelta(hours=hours_ago))
        )  # fmt: skip


def _operations() -> int:
    with transaction() as session:
        return session.scalar(select(func.count()).select_from(BulkOperation)) or 0


def test_a_dry_run_says_how_many_and_which_and_changes_nothing(db_url: str) -> None:
    # given a night with three runs failed on a model error, one past its deadline, one
    # cancelled, one still running, and a model-error failure from the night before
    started = [start_run(*REPORT, f"night-{n}").run_id for n in range(7)]
    model_errors, deadline, cancelled, running, yesterday = (
        started[:3], started[3], started[4], started[5], started[6]
    )  # fmt: skip
    _ended(model_errors, RunStatus.FAILED, "model_error", hours_ago=2)
    _ended([deadline], RunStatus.FAILED, "deadline", hours_ago=2)
    _ended([cancelled], RunStatus.CANCELLED, "cancelled", hours_ago=2)
    _ended([yesterday], RunStatus.FAILED, "model_error", hours_ago=26)
    tonight = (datetime.now(UTC) - timedelta(hours=12)).isoformat()

    # when the operator asks, by the CLI, what a retry of tonight's model errors would do
    asked = nightshift("runs", "bulk", "retry", "--agent", "nightly_report", "--stop-reason",
                       "model_error", "--started-after", tonight)  # fmt: skip

    # then it names the three, oldest first, and nothing was done or recorded
    assert asked.returncode == 0, asked.stderr
    assert "dry run: retry would act on 3 run(s) matching agent=nightly_report " in asked.stdout
    listed = [line.strip() for line in asked.stdout.splitlines() if line.startswith("  ")]
    assert sorted(listed) == sorted(str(run_id) for run_id in model_errors)
    assert "add --apply to retry them" in asked.stdout
    assert _operations() == 0
    with transaction() as session:
        retries = session.scalar(select(func.count()).where(Run.idempotency_key.like("retry-of:%")))
    assert retries == 0

    # and the API's dry run (the default) agrees; a run retried meanwhile drops out of it
    again = retry_run(model_errors[0], by="test").started.run_id
    api = client()
    answer = api.post(
        "/bulk",
        json={"kind": "retry", "filter": {"stop_reason": "model_error", "started_after": tonight}},
        headers=AUTH,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["dry_run"], body["count"], body["kind"]) == (True, 2, "retry")
    assert sorted(body["run_ids"]) == sorted(str(run_id) for run_id in model_errors[1:])
    assert _operations() == 0

    # and a cancel matches only what has not ended (the retry too, started last), a wider
    # retry every failed or cancelled run not retried yet
    cancel = bulk.preview("cancel", BulkFilter.parse({"agent": "nightly_report"}))
    retry = bulk.preview("retry", BulkFilter.parse({"agent": "nightly_report"}))
    assert [item.run_id for item in cancel.items] == [running, again]
    assert {item.run_id for item in retry.items} == {
        *model_errors[1:],
        deadline,
        cancelled,
        yesterday,
    }

    # and a filter that is missing or wrong is refused in one line that says what was wrong
    empty = api.post("/bulk", json={"kind": "cancel", "filter": {}}, headers=AUTH)
    assert empty.status_code == 422
    assert "needs a filter: at least one of agent, batch" in empty.json()["error"]
    wrong = nightshift("runs", "bulk", "cancel", "--status", "done")
    assert wrong.returncode == 2
    assert wrong.stderr.strip().startswith("nightshift: filter status 'done' is not a run status")
    with pytest.raises(InvalidInput, match="needs a timezone"):
        BulkFilter.parse({"started_after": "2026-12-01T02:00:00"})
    with pytest.raises(InvalidInput, match="is no kind of wait"):
        BulkFilter.parse({"waiting_on": "approvals"})
    nothing = nightshift("runs", "bulk", "retry", "--agent", "nobody", "--apply")
    assert nothing.returncode == 2
    assert "the filter matches nothing to retry: no operation was made" in nothing.stderr
    assert _operations() == 0


def _items(operation_id: str) -> list[BulkItem]:
    with transaction() as session:
        return list(
            session.scalars(
                select(BulkItem)
                .where(BulkItem.operation_id == uuid.UUID(operation_id))
                .order_by(BulkItem.position)
            )
        )


def _done(operation_id: str) -> int:
    return sum(1 for item in _items(operation_id) if item.done_at is not None)


def _finished(operation_id: str) -> bool:
    with transaction() as session:
        operation = session.get(BulkOperation, uuid.UUID(operation_id))
        return operation is not None and operation.finished_at is not None


def test_a_bulk_retry_of_40_failed_runs_killed_halfway_retries_each_once(
    db_url: str, processes: ProcessFactory, register_agents: Callable[..., None]
) -> None:
    # given 40 runs that failed where their agent was missing (the bug of the night)
    register_agents(ECHO)
    stock = processes(
        "stock", env={"NIGHTSHIFT_AGENTS": "", "NIGHTSHIFT_UNKNOWN_AGENT_SECONDS": "2"}
    )
    origins = [start_run("echo_outside", {"word": f"w{n}"}).run_id for n in range(40)]
    for origin in origins:
        row = wait_for_status(origin, DONE, timeout=120)
        assert (row.status, row.stop_reason) == (RunStatus.FAILED, "unknown_agent")
    stock.stop()
    # and the operator's bulk retry of them, made while no worker runs
    made = nightshift("runs", "bulk", "retry", "--agent", "echo_outside", "--stop-reason",
                      "unknown_agent", "--apply", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    operation = json.loads(made.stdout)["operation_id"]
    assert json.loads(made.stdout)["count"] == 40

    # and its 21st item held by another transaction, so that the worker stops right there, as
    # it would on a slow item (a connection of the test's own: no idle-in-transaction limit)
    with psycopg.connect(db_url.replace("+psycopg", "")) as holder:
        holder.execute(
            "SELECT 1 FROM bulk_items WHERE operation_id = %s AND position = 20 FOR UPDATE",
            (operation,),
        )
        # when a worker with the agent takes the operation up and is SIGKILLed in that item
        first = processes("first")
        wait_for(lambda: _done(operation) == 20, timeout=60, what="20 items done")
        first.kill()
        holder.rollback()
    assert _done(operation) == 20 and not _finished(operation)

    # then another worker and beat's tick take it up once its lease passed, and finish it
    processes("rescuer")
    processes("beat", beat=True)
    wait_for(lambda: _finished(operation), timeout=60, what="the operation to finish")
    items = _items(operation)
    assert [item.run_id for item in items] == origins
    # each item applied once: a second application would have found the retry and said so
    assert {item.outcome for item in items} == {"done"}
    retried_as = [uuid.UUID(item.detail.removeprefix("retried as run ")) for item in items]
    with transaction() as session:
        retries = session.execute(
            select(Run.id, Run.idempotency_key).where(Run.idempotency_key.like("retry-of:%"))
        ).all()
    assert len(retries) == 40
    assert {key for _, key in retries} == {f"retry-of:{origin}" for origin in origins}
    assert {run_id for run_id, _ in retries} == set(retried_as)
    # and every retry runs to the end on the worker that has the agent
    for retry in retried_as:
        assert wait_for_status(retry, DONE, timeout=120).status is RunStatus.SUCCEEDED


def test_a_bulk_reject_decides_every_pending_approval_as_its_approver_would(
    services_up: Services,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given five runs waiting for the lead's approval of a pull request each, and a run of
    # another agent
    register_agents(APPROVAL_ONLY)
    monkeypatch.setenv("NIGHTSHIFT_APPROVERS_OPEN_PULL", LEAD)
    processes("w1")
    processes("beat", beat=True)
    waiting = [
        start_run("approval_only", {"issue": n, "repo": "acme/shop"}).run_id for n in range(5)
    ]
    for run_id in waiting:
        assert wait_for_status(run_id, {RunStatus.WAITING}).waiting_on.startswith("approval:")
    other = start_run(*REPORT).run_id
    api = client()
    wanted = {"agent": "approval_only", "waiting_on": "approval"}

    # when someone who is not an approver asks for a bulk reject through the API
    stranger = create_token("mallory@example.com", "test").token
    refused = api.post(
        "/bulk",
        json={"kind": "reject", "filter": wanted, "dry_run": False},
        headers={"Authorization": f"Bearer {stranger}"},
    )
    assert refused.status_code == 201, refused.text
    first = refused.json()["operation_id"]
    wait_for(lambda: _finished(first), timeout=30, what="the stranger's operation to finish")
    # then each item is refused as the single decision would be, and nothing changed
    shown = api.get(f"/bulk/{first}", headers=AUTH).json()
    assert (shown["total"], shown["done"], shown["outcomes"]) == (5, 5, {"refused": 5})
    assert all("is not among the approvers" in item["detail"] for item in shown["items"])
    assert all(run_row(run_id).status == RunStatus.WAITING for run_id in waiting)

    # when the lead rejects them all from the CLI, after a dry run that names the five
    dry = nightshift("runs", "bulk", "reject", "--agent", "approval_only", "--waiting-on",
                     "approval", "--json")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["count"] == 5
    done = nightshift("runs", "bulk", "reject", "--agent", "approval_only", "--waiting-on",
                      "approval", "--as", LEAD, "--note", "wrong fix", "--apply", "--wait",
                      "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    operation = json.loads(done.stdout)
    assert (operation["done"], operation["outcomes"]) == (5, {"done": 5})

    # then every run goes on with its rejection and ends, and no pull request was opened
    for run_id in waiting:
        assert wait_for_status(run_id, DONE).status is RunStatus.SUCCEEDED
    assert opened_pulls(services_up.githost) == []
    # and each decision is the lead's, audited as made by this operation from the CLI
    with transaction() as session:
        decided = session.execute(
            select(Action.decision, Action.decided_by, Action.note).where(
                Action.run_id.in_(waiting)
            )
        ).all()
        audits = session.scalars(
            select(ActionAudit.via).where(ActionAudit.run_id.in_(waiting))
        ).all()
    assert set(decided) == {("reject", LEAD, "wrong fix")}
    assert len(audits) == 5
    assert all(via.startswith(f"bulk {operation['id']}, cli --as") for via in audits)
    # and the other agent's run was never an item
    assert str(other) not in {item["run_id"] for item in operation["items"]}
    # and the status page lists both operations, and shows each one's progress
    page = client()
    signed = submit_login(page, {"token": person_token(LEAD)}, follow_redirects=False)
    assert signed.status_code == 303, signed.text
    front = page.get("/ui").text
    assert f"/ui/bulk/{operation['id']}" in front and f"/ui/bulk/{first}" in front
    rejected = page.get(f"/ui/bulk/{operation['id']}")
    assert rejected.status_code == 200
    assert '<span class="count">5/5</span>' in rejected.text
    assert 'done <span class="n-done">5</span>' in rejected.text
    assert "finished at" in rejected.text and "wrong fix" in rejected.text
    assert 'refused <span class="n-refused">5</span>' in page.get(f"/ui/bulk/{first}").text


def test_an_operation_acts_on_what_it_matched_when_made_each_as_the_single_action(
    db_url: str,
) -> None:
    # given three patch runs waiting for approvals anyone may give, and two reports running
    parked = [
        park_on_approval(f"patch:acme/shop:patch/issue-{n}", bug={**BUG, "issue": n})
        for n in range(1, 4)
    ]
    reports = [start_run(*REPORT, f"report-{n}").run_id for n in range(2)]
    by = Actor("ops@example.com", "test")
    approve = bulk.create("approve", BulkFilter.parse({"agent": "patch"}), by, "go")
    cancel = bulk.create("cancel", BulkFilter.parse({"agent": "nightly_report"}), by, "bad night")
    # and, before a worker applies them, one approval decided by hand and one report ended,
    # and a third report started: not matched when the operation was made
    decide(approve.items[0].action_key, "approve", by)
    _ended([reports[1]], RunStatus.FAILED, "model_error", hours_ago=0)
    late = start_run(*REPORT, "report-late").run_id

    # when a worker applies each operation (the task's own call)
    assert bulk.process(approve.operation_id) == 3
    assert bulk.process(cancel.operation_id) == 2
    assert bulk.process(cancel.operation_id) == 0  # finished: a re-send applies nothing

    # then each item says what its single action did, the decided one and the ended run as
    # "already", and the late run was never touched
    approved = [(item.outcome, item.detail) for item in _items(str(approve.operation_id))]
    assert approved[0][0] == "already"
    assert [outcome for outcome, _ in approved[1:]] == ["done", "done"]
    assert {action_row(item.action_key).state for item in approve.items} == {ActionState.INTENDED}
    assert all(run_row(run_id).status == RunStatus.RUNNING for run_id in parked)
    cancelled = [(item.outcome, item.detail) for item in _items(str(cancel.operation_id))]
    assert cancelled == [
        ("done", "cancel requested: the run is running and stops at its next check"),
        ("already", "run had ended (failed)"),
    ]
    assert run_row(reports[0]).cancel_requested
    assert not run_row(late).cancel_requested and _finished(str(cancel.operation_id))
