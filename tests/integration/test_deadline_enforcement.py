"""Deadlines from every entry point, enforced for waiting runs too: a run parked on an approval,
a timer or a person past its deadline ends with reason `deadline`, its approvals withdrawn."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, update

from models import Action, ActionAudit, ActionState, Batch, Run, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.errors import InvalidInput, StatusConflict
from pipeline.runs.cancel import cancel_run
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.external_events import start_from_event
from pipeline.runs.schedules import check_schedule
from pipeline.runs.start import start_run
from pipeline.runs.tick import tick
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.slots import Schedule
from tests.integration.api_fixtures import (
    AUTH,
    PR_KEY,
    action_row,
    as_seen,
    bearer,
    client,
    park_on_approval,
    person_token,
    signed,
)
from tests.integration.conftest import ProcessFactory
from tests.support import run_row, wait_for_status

PATCH_KEY = "approval_only:acme/shop:patch/issue-51"
LEAD = Actor("lead@example.com", "test")


def seconds_left(run_id: uuid.UUID) -> float:
    with transaction() as session:
        left = session.scalar(select(Run.deadline - func.now()).where(Run.id == run_id))
    assert left is not None
    return left.total_seconds()


def move_deadline(run_id: uuid.UUID, by: timedelta) -> None:
    with transaction() as session:
        session.execute(update(Run).where(Run.id == run_id).values(deadline=func.now() + by))


def test_a_run_waiting_for_approval_ends_at_its_deadline_and_its_approval_is_refused(
    githost: GitHostSandbox, processes: ProcessFactory, register_agents: Callable[..., None]
) -> None:
    # given a worker and beat, and a run that will ask to open a pull request, started
    # through the API with 5 seconds to go
    register_agents("tests.fixture_agents:APPROVAL_ONLY")
    processes("w1")
    processes("beat", beat=True)
    api = client()
    bug = {"issue": 51, "repo": "acme/shop", "title": "totals are not rounded"}
    started = api.post(
        "/runs", json={"agent": "approval_only", "input": bug, "deadline": 5}, headers=AUTH
    )
    assert started.status_code == 201, started.text
    run_id = uuid.UUID(started.json()["run_id"])

    # when it waits for its pull request to be approved, and nobody approves in time
    parked = wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=5)
    assert parked.waiting_on == f"approval:{PATCH_KEY}"
    ended = wait_for_status(run_id, {RunStatus.FAILED.value}, timeout=15)

    # then it ended with reason deadline, and its approval was withdrawn
    assert ended.stop_reason == "deadline" and "approval:" in ended.error
    assert action_row(PATCH_KEY).state is ActionState.WITHDRAWN
    # and a late approval, by webhook or by hand, is refused and opens nothing
    lead = client(headers=bearer(person_token("lead@example.com")))
    path = f"/approvals/{PATCH_KEY}"
    late = lead.post(path, **signed(path, {"decision": "approve", **as_seen(PATCH_KEY)}))
    assert late.status_code == 409 and "withdrawn" in late.json()["error"]
    with pytest.raises(StatusConflict, match="withdrawn"):
        decide(PATCH_KEY, Decision.APPROVE, LEAD)
    assert githost.log.entries() == []
    assert run_row(run_id).status is RunStatus.FAILED


def test_an_approval_after_the_deadline_is_refused_even_before_the_tick_ends_the_run(
    db_url: str,
) -> None:
    # given a run waiting for approval whose deadline has just passed (no tick yet)
    run_id = park_on_approval()
    move_deadline(run_id, timedelta(seconds=-1))
    # then an approval is refused, naming the deadline, and changes nothing
    with pytest.raises(StatusConflict, match="deadline passed"):
        decide(PR_KEY, Decision.APPROVE, LEAD)
    assert action_row().state is ActionState.PENDING_APPROVAL
    # when the tick comes, it ends the run and withdraws the approval
    assert tick().expired == [run_id]
    row = run_row(run_id)
    assert (row.status, row.stop_reason, row.wake_at) == (RunStatus.FAILED, "deadline", None)
    action = action_row()
    assert (action.state, action.resolution) == (ActionState.WITHDRAWN, "deadline")
    with transaction() as session:
        trail = session.execute(select(ActionAudit.event, ActionAudit.by, ActionAudit.via)).all()
    assert trail == [("withdrawn", "nightshift", "the run ended (deadline)")]
    with pytest.raises(StatusConflict, match="withdrawn"):
        decide(PR_KEY, Decision.REJECT, LEAD)
    # and a second tick finds nothing more to do
    assert tick().expired == []


def test_runs_waiting_on_a_timer_or_a_person_end_at_their_deadline_too(db_url: str) -> None:
    # given a run waiting on a timer due tomorrow, one waiting for a person to say whether an
    # email went out, and one whose deadline is still ahead
    timer, person, later = (start_run("follow_up", {"after_seconds": 5}).run_id for _ in "abc")
    with transaction() as session:
        session.execute(
            update(Run)
            .where(Run.id.in_([timer, later]))
            .values(
                status=RunStatus.WAITING,
                waiting_on="timer:toolu_s000_0",
                wake_at=func.now() + timedelta(days=1),
            )
        )
        session.execute(
            update(Run)
            .where(Run.id == person)
            .values(status=RunStatus.NEEDS_ATTENTION, waiting_on="action:email:x")
        )
        session.add(
            Action(idempotency_key="email:x", run_id=person, tool="send_email", service="email",
                   args={}, state=ActionState.OUTCOME_UNKNOWN, approvers=[])
        )  # fmt: skip
    for run_id in (timer, person):
        move_deadline(run_id, timedelta(seconds=-1))
    move_deadline(later, timedelta(hours=1))

    # when the tick comes
    expired = tick().expired

    # then the two past their deadline ended, saying what they waited on; the other waits on
    assert sorted(expired) == sorted([timer, person])
    for run_id, waited in ((timer, "timer:toolu_s000_0"), (person, "action:email:x")):
        row = run_row(run_id)
        assert (row.status, row.stop_reason) == (RunStatus.FAILED, "deadline")
        assert waited in row.error
    assert run_row(later).status is RunStatus.WAITING
    # and an unknown outcome stays unknown: only a person can say whether the email went out
    assert action_row("email:x").state is ActionState.OUTCOME_UNKNOWN


def test_cancelling_a_waiting_run_withdraws_its_pending_approvals(db_url: str) -> None:
    run_id = park_on_approval()
    assert cancel_run(run_id, by="lead").status is RunStatus.CANCELLED
    action = action_row()
    assert (action.state, action.resolution) == (ActionState.WITHDRAWN, "cancelled")
    with pytest.raises(StatusConflict, match="withdrawn"):
        decide(PR_KEY, Decision.APPROVE, LEAD)


# -- every entry point ----------------------------------------------------------------------

REPORT = {"team": "ops", "date": "2026-11-29"}


@pytest.mark.parametrize(
    ("deadline", "expected_seconds"),
    [(90, 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1.5h", 5400)],
)
def test_the_api_takes_a_deadline_as_seconds_or_a_duration(
    db_url: str, deadline: object, expected_seconds: float
) -> None:
    response = client().post(
        "/runs", json={"agent": "nightly_report", "input": REPORT, "deadline": deadline},
        headers=AUTH,
    )  # fmt: skip
    assert response.status_code == 201, response.text
    left = seconds_left(uuid.UUID(response.json()["run_id"]))
    assert expected_seconds - 5 < left <= expected_seconds


def test_the_api_takes_a_deadline_as_a_time_and_refuses_bad_ones(db_url: str) -> None:
    api = client()
    at = (datetime.now(UTC) + timedelta(hours=3)).replace(microsecond=0)
    ok = api.post(
        "/runs",
        json={"agent": "nightly_report", "input": REPORT, "deadline": at.isoformat()},
        headers=AUTH,
    )
    assert ok.status_code == 201, ok.text
    assert run_row(uuid.UUID(ok.json()["run_id"])).deadline == at
    for bad, why in (
        ("tomorrow", "must be seconds, a duration"),
        ("2020-01-01T00:00:00Z", "is in the past"),
        ("2099-01-01T00:00:00", "has no timezone"),
        (-5, "must be in the future"),
        ("400d", "more than 366 days"),
        (True, "must be seconds"),
    ):
        response = api.post(
            "/runs", json={"agent": "nightly_report", "input": REPORT, "deadline": bad},
            headers=AUTH,
        )  # fmt: skip
        assert response.status_code == 422, (bad, response.text)
        assert "'deadline'" in response.json()["error"] and why in response.json()["error"]
    with transaction() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 1


def test_the_command_line_takes_a_deadline(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["start", "nightly_report", "--input", '{"team": "ops", "date": "2026-11-29"}',
                 "--deadline", "10m", "--json"]) == 0  # fmt: skip
    run_id = uuid.UUID(json.loads(capsys.readouterr().out)["run_id"])
    assert 590 < seconds_left(run_id) <= 600
    assert main(["start", "nightly_report", "--input", "{}", "--deadline", "soon"]) == 2
    assert "--deadline must be seconds, a duration" in capsys.readouterr().err


def test_other_services_set_a_deadline_through_delay(
    db_url: str, processes: ProcessFactory
) -> None:
    from pipeline.tasks import start_run as task

    processes("w1")
    run_id = uuid.UUID(task.delay("nightly_report", REPORT, None, "30m").get(timeout=30))
    assert 1790 < seconds_left(run_id) <= 1800
    at = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    other = uuid.UUID(task.delay("nightly_report", REPORT, "k-2", at.isoformat()).get(timeout=30))
    assert run_row(other).deadline == at


def test_an_event_source_sets_the_deadline_of_the_runs_it_starts(
    db_url: str, register_agents: Callable[..., None]
) -> None:
    register_agents("tests.fixture_agents:DEADLINED_REPORT")
    # an incident report: its source gives every run half an hour
    incident = start_from_event("incident-report", "inc-1", REPORT).run_id
    assert 1790 < seconds_left(incident) <= 1800
    # a customer request says itself how long it may take; without one, no deadline
    asked = start_from_event("customer-report", "c-1", {**REPORT, "respond_within": "2h"})
    assert 7190 < seconds_left(asked.run_id) <= 7200
    assert run_row(start_from_event("customer-report", "c-2", REPORT).run_id).deadline is None
    # and a deadline it cannot read is refused, starting nothing
    with pytest.raises(InvalidInput, match="the deadline of event customer-report/c-3"):
        start_from_event("customer-report", "c-3", {**REPORT, "respond_within": "soon"})
    with transaction() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 3


def test_a_schedule_deadline_counts_from_the_slot_for_runs_and_whole_batches(
    db_url: str, register_agents: Callable[..., None]
) -> None:
    # a nightly report slot at 02:00 must be done by 08:00
    report = Schedule(name="nightly", agent="nightly_report", hour="2", params={"team": "ops"},
                      deadline=timedelta(hours=6))  # fmt: skip
    slot = datetime(2026, 11, 29, 2, tzinfo=UTC)
    [fired] = check_schedule(report, now=slot + timedelta(seconds=10))
    assert run_row(fired.run_id).deadline == slot + timedelta(hours=6)
    # a batch: the batch, every child and (when it starts) the synthesis share the deadline
    register_agents("tests.fixture_agents:TEST_BATCH")
    batchy = Schedule(name="batchy", agent="test_batch", hour="2", deadline=timedelta(hours=4))
    [night] = check_schedule(batchy, now=slot + timedelta(seconds=10))
    with transaction() as session:
        batch = session.get(Batch, night.batch_id)
        assert batch is not None and batch.deadline == slot + timedelta(hours=4)
        children = session.scalars(select(Run).where(Run.batch_id == night.batch_id)).all()
        assert [c.deadline for c in children] == [slot + timedelta(hours=4)] * 2
        session.execute(
            update(Run).where(Run.batch_id == night.batch_id).values(status=RunStatus.SUCCEEDED)
        )
    tick()  # the join: every child is done, so the synthesis starts
    with transaction() as session:
        batch = session.get(Batch, night.batch_id)
        assert batch is not None and batch.synthesis_run_id is not None
        synthesis = session.get(Run, batch.synthesis_run_id)
        assert synthesis is not None and synthesis.deadline == slot + timedelta(hours=4)
