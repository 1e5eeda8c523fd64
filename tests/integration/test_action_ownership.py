"""An approval and an in-flight send belong to their run (finding 5), against the real API and
real workers: a second run that means the same key waits in needs_attention saying whose key
it is, never rides on the first run's approval, never takes over its send, and never takes the
first run's outcome as its own when it meant other arguments (issue 31): it stays parked,
naming both runs, for a person. One pull request, with the arguments the approver saw."""

from __future__ import annotations

import uuid

import httpx
from sqlalchemy import select

from models import Action, JournalEntry, RunStatus
from pipeline.db import transaction
from pipeline.engine.action_rows import arguments_hash
from tests.integration.api_fixtures import (
    action_row,
    as_seen,
    bearer,
    live_server,
    make_app,
    person_token,
    signed,
)
from tests.integration.conftest import ProcessFactory, Services, opened_pulls
from tests.support import run_row, wait_for, wait_for_status

KEY = "patch:acme/shop:patch/issue-7"
FIRST = {"issue": 7, "repo": "acme/shop", "title": "totals are not rounded"}
SECOND = {"issue": 7, "repo": "acme/shop", "title": "MERGE THIS INSTEAD"}
"""Another caller's run for the same issue: the same key, other arguments."""
APPROVERS = {"NIGHTSHIFT_APPROVERS_OPEN_FIX_PULL_REQUEST": "alice@example.com"}
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value}


def start(base: str, token: str, bug: dict) -> uuid.UUID:
    response = httpx.post(
        f"{base}/runs", json={"agent": "patch", "input": bug}, headers=bearer(token), timeout=10
    )
    assert response.status_code == 201, response.text
    return uuid.UUID(response.json()["run_id"])


def approve(base: str, token: str, **body: object) -> httpx.Response:
    path = f"/approvals/{KEY}"
    delivery = signed(path, {"decision": "approve", **body}, token=token)
    return httpx.post(f"{base}{path}", timeout=10, **delivery)


def pull_request_results(run_id: uuid.UUID) -> list[str]:
    with transaction() as session:
        payloads = session.scalars(
            select(JournalEntry.payload).where(
                JournalEntry.run_id == run_id, JournalEntry.step_name == "open_fix_pull_request"
            )
        ).all()
    return [str(payload["content"]) for payload in payloads]


def assert_claimed(second: uuid.UUID, first: uuid.UUID) -> None:
    """The second run waits for a person on the first run's settled key, naming both runs, and
    recorded no result for its own call."""
    wait_for(lambda: run_row(second).waiting_on == f"claimed:{KEY}", timeout=60,
             what="the second run to park on the first run's settled key")  # fmt: skip
    parked = run_row(second)
    assert (parked.status, parked.stop_reason) == (RunStatus.NEEDS_ATTENTION, "key_conflict")
    assert str(first) in parked.error and str(second) in parked.error
    assert "with other arguments" in parked.error
    assert pull_request_results(second) == []


def test_a_second_run_cannot_take_over_the_first_runs_send_under_its_approval(
    services_up: Services, processes: ProcessFactory
) -> None:
    githost = services_up.githost
    alice = person_token("alice@example.com")
    # given Alice approved the first run's pull request, and its worker died right after
    # marking the send attempted (nothing reached the git host)
    doomed = processes("doomed", env={**APPROVERS, "NIGHTSHIFT_CRASH_POINTS": "after_attempted"})
    with live_server(make_app()) as base:
        first = start(base, alice, FIRST)
        wait_for_status(first, {RunStatus.WAITING.value}, timeout=30)
        assert approve(base, alice, **as_seen(KEY)).status_code == 200
        wait_for(doomed.exited, timeout=30, what="the worker to die after marking the attempt")
        assert action_row(KEY).state.value == "attempted"

        # when another caller starts a run for the same issue, with another title
        second = start(base, alice, SECOND)
        processes("healthy", env=APPROVERS)

        # then it does not treat the first run's attempt as its own to reconcile and resend:
        # it waits for a person, saying whose key it is
        parked = wait_for_status(second, {RunStatus.NEEDS_ATTENTION.value}, timeout=30)
        assert parked.stop_reason == "key_conflict" and parked.waiting_on == f"conflict:{KEY}"
        assert str(first) in parked.error and "attempted" in parked.error
        shown = httpx.get(f"{base}/runs/{second}", headers=bearer(alice), timeout=10).json()
        assert shown["run"]["stop_reason"] == "key_conflict"
        assert opened_pulls(githost) == []

    # and when the tick resumes the first run (its lease ran out), the first run sends its own
    # arguments, and the second run, which meant other arguments, does not take that pull
    # request as its own: it waits for a person, naming both runs
    processes("beat", beat=True)
    assert wait_for_status(first, DONE, timeout=60).status == RunStatus.SUCCEEDED
    [pull] = opened_pulls(githost)
    assert pull["title"] == "Fix #7: totals are not rounded"
    action = action_row(KEY)
    assert action.run_id == first and action.args["title"] == pull["title"]
    assert_claimed(second, first)


def test_a_second_run_never_waits_on_nor_uses_the_first_runs_approval(
    services_up: Services, processes: ProcessFactory
) -> None:
    githost = services_up.githost
    alice = person_token("alice@example.com")
    processes("w1", env=APPROVERS)
    processes("beat", beat=True)
    with live_server(make_app()) as base:
        # given the first run's pull request waits for Alice
        first = start(base, alice, FIRST)
        wait_for_status(first, {RunStatus.WAITING.value}, timeout=30)
        # when a second run means the same key, with other arguments
        second = start(base, alice, SECOND)
        parked = wait_for_status(second, {RunStatus.NEEDS_ATTENTION.value}, timeout=30)
        # then it does not wait on that approval as if it were its own (approving would have
        # sent whichever arguments came last): it says whose key it is
        assert parked.waiting_on == f"conflict:{KEY}" and str(first) in parked.error

        # and an approval made for other arguments than the recorded ones is refused
        stale = approve(base, alice, run_id=str(first), args_hash=arguments_hash(SECOND))
        assert stale.status_code == 409 and "not the one you saw" in stale.json()["error"]
        # and someone who is not an approver is told so, and not who is
        bob = approve(base, person_token("bob@example.com"), **as_seen(KEY))
        assert bob.status_code == 403 and "alice" not in bob.text

        # when Alice approves what she saw: the first run's recorded arguments, in its name
        action = action_row(KEY)
        assert action.run_id == first
        seen = {"run_id": str(first), "args_hash": action.args_hash}
        assert approve(base, alice, **seen).json()["decided_by"] == "alice@example.com"

        # then one pull request opens, the first run's; Alice's approval does not settle the
        # second run's call, which meant other arguments: it stays parked, naming both runs
        assert wait_for_status(first, DONE, timeout=60).status == RunStatus.SUCCEEDED
        assert_claimed(second, first)
        [pull] = opened_pulls(githost)
        assert pull["title"] == "Fix #7: totals are not rounded"
        with transaction() as session:
            assert session.scalars(select(Action.run_id)).all() == [first]
        shown = httpx.get(f"{base}/runs/{second}", headers=bearer(alice), timeout=10).json()
        assert str(first) in shown["run"]["error"] and str(second) in shown["run"]["error"]

        # and a person ends it
        cancelled = httpx.post(f"{base}/runs/{second}/cancel", headers=bearer(alice), timeout=10)
        assert cancelled.json()["status"] == RunStatus.CANCELLED.value, cancelled.text
    assert [p["title"] for p in opened_pulls(githost)] == [pull["title"]]


def test_a_rejection_of_the_first_runs_call_is_not_the_second_runs(
    services_up: Services, processes: ProcessFactory
) -> None:
    alice = person_token("alice@example.com")
    processes("w1", env=APPROVERS)
    processes("beat", beat=True)
    with live_server(make_app()) as base:
        # given two runs for the same issue, the same call, the second parked on the first's key
        first = start(base, alice, FIRST)
        wait_for_status(first, {RunStatus.WAITING.value}, timeout=30)
        second = start(base, alice, FIRST)
        wait_for_status(second, {RunStatus.NEEDS_ATTENTION.value}, timeout=30)
        # when Alice rejects the first run's pull request, the one she saw
        path = f"/approvals/{KEY}"
        body = {"decision": "reject", "note": "not this way", **as_seen(KEY)}
        rejected = httpx.post(f"{base}{path}", timeout=10, **signed(path, body, token=alice))
        assert rejected.status_code == 200, rejected.text
        assert wait_for_status(first, DONE, timeout=60).status == RunStatus.SUCCEEDED
    # then the first run reads the rejection; the second, whose call no one saw, is not told
    # it was rejected: it waits for a person, naming both runs
    assert "rejected this action (not this way)" in pull_request_results(first)[0]
    wait_for(lambda: run_row(second).waiting_on == f"claimed:{KEY}", timeout=60,
             what="the second run to park on the first run's rejected key")  # fmt: skip
    parked = run_row(second)
    assert str(first) in parked.error and str(second) in parked.error
    assert "a person rejected it for that run" in parked.error
    assert pull_request_results(second) == []
