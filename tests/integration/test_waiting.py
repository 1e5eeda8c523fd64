"""Waiting for days with no process: timers, single-use approvals, cancellation, deadlines."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
import redis
from sqlalchemy import func, select, update

from models import Action, ActionState, Run, RunStatus
from pipeline.app import STEP_TASK, app
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.errors import DecisionConflict, RunStopped, StopStep, UnknownAction
from pipeline.runs.cancel import cancel_run
from pipeline.runs.decisions import Decision, decide
from pipeline.runs.retention import cleanup
from pipeline.runs.start import create_run_txn, start_run
from pipeline.settings import get_settings
from tests.integration.api_fixtures import REVIEWER_ACTOR, action_row, audit_trail
from tests.integration.conftest import ProcessFactory, Services, opened_pulls
from tests.support import ServiceUrls, run_row, wait_for, wait_for_status

BUG = {"issue": 42, "repo": "acme/shop", "title": "totals are not rounded"}
PR_KEY = "patch:acme/shop:patch/issue-42"
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value}


def statuses(run_ids: list[uuid.UUID]) -> dict[str, int]:
    with transaction() as session:
        rows = session.execute(
            select(Run.status, func.count()).where(Run.id.in_(run_ids)).group_by(Run.status)
        ).all()
    return {status.value: count for status, count in rows}


def broker_messages(services: ServiceUrls, run_ids: list[uuid.UUID]) -> int:
    """Step messages for these runs: queued, or delivered and not yet acknowledged.

    (kombu keeps unacked messages in one hash for every queue of the database; workers that
    earlier tests killed leave theirs there until the visibility timeout.)
    """
    wanted = {str(run_id) for run_id in run_ids}
    client = redis.Redis.from_url(services.broker)
    try:
        queued = [json.loads(raw) for raw in client.lrange(get_settings().queue, 0, -1)]
        unacked = [json.loads(raw)[0] for raw in client.hvals("unacked")]
    finally:
        client.close()
    return sum(1 for message in queued + unacked if _run_of(message) in wanted)


def _run_of(message: dict) -> str:
    args = message.get("headers", {}).get("argsrepr", "")
    return args.strip("()[]',\" ")


def test_a_thousand_waiting_runs_hold_no_message_and_no_worker_then_all_resume(
    services_up: Services,
    processes: ProcessFactory,
    services: ServiceUrls,
    register_agents: Callable[..., None],
) -> None:
    # given 500 runs that will check back in a while and 500 waiting for an approval
    # (a long hand-off grace: the queue is long for a while, and re-sending handed-off runs
    # then would only add duplicate messages)
    # (Patch's approval without its repository work: the waits are what is measured here)
    patient = {"NIGHTSHIFT_HANDOFF_GRACE_SECONDS": "120"}
    register_agents("tests.fixture_agents:APPROVAL_ONLY")
    workers = [processes(name, concurrency=16, env=patient) for name in ("w1", "w2")]
    processes("beat", beat=True)
    wait_seconds = 90  # long enough for all 1,000 to park first
    timers = [start_run("follow_up", {"after_seconds": wait_seconds}).run_id for _ in range(500)]
    approvals = [start_run("approval_only", {**BUG, "issue": 1000 + n}).run_id for n in range(500)]
    everyone = timers + approvals
    wait_for(lambda: statuses(everyone).get("waiting") == 1000, timeout=120, interval=1,
             what="all 1,000 runs to be waiting")  # fmt: skip

    # then no broker message and no worker slot is held by them
    wait_for(lambda: broker_messages(services, everyone) == 0, timeout=10, what="no messages")
    inspector = app.control.inspect(destination=[w.nodename for w in workers], timeout=2)
    for busy in (inspector.active() or {}, inspector.reserved() or {}):
        # (beat's tick and the schedule check may be running: they hold no run)
        steps = [task for tasks in busy.values() for task in tasks if task["name"] == STEP_TASK]
        assert steps == [], busy

    # when their time comes (approvals are given; the timers fall due)
    with transaction() as session:
        due = session.scalar(select(func.max(Run.wake_at)).where(Run.id.in_(timers)))
        now = session.scalar(select(func.now()))
    assert due is not None and now is not None and due > now
    timers_due_in = (due - now).total_seconds()
    for n in range(500):
        decide(f"approval_only:acme/shop:patch/issue-{1000 + n}", Decision.APPROVE, REVIEWER_ACTOR)
    approved_at = time.monotonic()

    # then every run leaves waiting within the tick interval plus a few seconds
    margin = get_settings().tick_seconds + 5
    wait_for(lambda: not statuses(approvals).get("waiting"), timeout=margin, interval=0.2,
             what="the approved runs to resume")  # fmt: skip
    print(
        f"\napproved runs resumed within {time.monotonic() - approved_at:.1f}s of the last approval"
    )
    time.sleep(max(0.0, timers_due_in - (time.monotonic() - approved_at)))
    due_at = time.monotonic()
    wait_for(lambda: not statuses(timers).get("waiting"), timeout=margin, interval=0.2,
             what="the timer runs to resume")  # fmt: skip
    print(f"timer runs resumed within {time.monotonic() - due_at:.1f}s of falling due")
    wait_for(lambda: statuses(everyone).get("succeeded") == 1000, timeout=180, interval=1,
             what="all runs to finish")  # fmt: skip
    assert len(opened_pulls(services_up.githost)) == 500


def test_an_approval_fired_twice_at_once_executes_once(
    services_up: Services, processes: ProcessFactory
) -> None:
    processes("w1")
    run_id = start_run("patch", BUG).run_id
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=30)

    # when two approvals of the same action arrive at the same moment
    results = []
    barrier = threading.Barrier(2)

    def approve() -> None:
        barrier.wait()
        results.append(decide(PR_KEY, Decision.APPROVE, REVIEWER_ACTOR))

    threads = [threading.Thread(target=approve) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # then one of them decided, the other got the same outcome, and one pull request opened
    assert sorted(r.first for r in results) == [False, True]
    row = wait_for_status(run_id, DONE, timeout=30)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert len(opened_pulls(services_up.githost)) == 1
    assert decide(PR_KEY, Decision.APPROVE, REVIEWER_ACTOR).first is False
    with pytest.raises(DecisionConflict, match="already decided"):
        decide(PR_KEY, Decision.REJECT, REVIEWER_ACTOR)
    with pytest.raises(UnknownAction, match="no-such-key"):
        decide("no-such-key", Decision.APPROVE, REVIEWER_ACTOR)


def test_a_rejection_is_told_to_the_model_and_nothing_is_opened(
    services_up: Services, processes: ProcessFactory
) -> None:
    processes("w1")
    run_id = start_run("patch", BUG).run_id
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=30)
    decide(PR_KEY, Decision.REJECT, REVIEWER_ACTOR, note="needs a test first")
    row = wait_for_status(run_id, DONE, timeout=30)
    assert row.status == RunStatus.SUCCEEDED
    assert "rejected" in row.result["text"] and "needs a test first" in row.result["text"]
    assert opened_pulls(services_up.githost) == []


def test_a_worker_killed_after_approval_before_the_reply_is_saved_opens_one_pull(
    services_up: Services, processes: ProcessFactory
) -> None:
    processes("beat", beat=True)
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_send_before_reply"})
    run_id = start_run("patch", BUG).run_id
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=30)
    decide(PR_KEY, Decision.APPROVE, REVIEWER_ACTOR)
    wait_for(doomed.exited, timeout=30, what="the worker to die after the send")
    assert len(opened_pulls(services_up.githost)) == 1

    processes("healthy")
    row = wait_for_status(run_id, DONE, timeout=60)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert len(opened_pulls(services_up.githost)) == 1
    with transaction() as session:
        action = session.scalar(select(Action).where(Action.idempotency_key == PR_KEY))
    assert action is not None and action.resolution == "lookup"


def test_cancel_while_waiting_is_immediate_and_while_running_stops_before_the_next_call(
    services_up: Services, processes: ProcessFactory
) -> None:
    processes("w1")
    # waiting: cancelled at once, no worker involved
    waiting = start_run("patch", BUG).run_id
    wait_for_status(waiting, {RunStatus.WAITING.value}, timeout=30)
    assert cancel_run(waiting, by="ops@example.com").status == RunStatus.CANCELLED
    row = run_row(waiting)
    assert (row.status, row.cancel_requested_by) == (RunStatus.CANCELLED, "ops@example.com")
    assert row.cancel_requested_at is not None

    # running: the timer agent's first fetch is slow; cancel while it is in flight
    services_up.web.fail("/sources/deploys", 503, times=2)  # retried: keeps the step busy
    running = start_run("follow_up", {"after_seconds": 3600}).run_id
    wait_for(lambda: run_row(running).lease_owner, timeout=30, what="the run to be claimed")
    cancel_run(running, by="ops@example.com")
    row = wait_for_status(running, DONE, timeout=30)
    assert row.status == RunStatus.CANCELLED
    assert row.stop_reason == "cancelled"
    assert row.wake_at is None  # it never got as far as waiting


def test_an_unknown_outcome_of_a_cancelled_run_can_be_settled_and_then_forgotten(
    services_up: Services, processes: ProcessFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # given an approved pull request whose worker died after marking it attempted
    processes("beat", beat=True)
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_attempted"})
    run_id = start_run("patch", BUG).run_id
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=30)
    decide(PR_KEY, Decision.APPROVE, REVIEWER_ACTOR)
    wait_for(doomed.exited, timeout=30, what="the worker to die after marking the attempt")

    # when the run is cancelled before anyone reconciled the attempt
    cancel_run(run_id, by="lead")
    processes("healthy")
    assert wait_for_status(run_id, DONE, timeout=60).status == RunStatus.CANCELLED
    # then the attempt is an unknown outcome, which retention keeps whole (the run is
    # compacted) until someone settles it
    assert action_row(PR_KEY).state == ActionState.OUTCOME_UNKNOWN
    args = action_row(PR_KEY).args
    kept = cleanup(timedelta(0))
    assert [k.run_id for k in kept.kept] == [run_id]
    assert [c.run_id for c in kept.compacted] == [run_id]
    assert action_row(PR_KEY).args == args and action_row(PR_KEY).compacted_at is None

    # when a person checks the git host and says it did not happen (refused before the fix:
    # "nothing would carry out a decision now")
    assert main(["actions", "resolve", PR_KEY, "--did-not-happen"]) == 0
    capsys.readouterr()

    # then the key is released, the next compaction takes the settled action (patch declares
    # nothing of a pull request personal: its arguments stay), and the next run for the issue
    # proposes the pull request afresh (its own approval), which opens once
    assert action_row(PR_KEY).state == ActionState.RELEASED
    assert [entry.event for entry in audit_trail(PR_KEY)] == [
        "approve",
        "run_ended",
        "did_not_happen",
    ]
    assert action_row(PR_KEY).compacted_at is None
    assert [c.run_id for c in cleanup(timedelta(0)).compacted] == [run_id]
    assert action_row(PR_KEY).args == args and action_row(PR_KEY).compacted_at is not None
    assert cleanup(timedelta(0)).compacted == []
    again = start_run("patch", BUG).run_id
    wait_for_status(again, {RunStatus.WAITING.value}, timeout=30)
    assert action_row(PR_KEY).state == ActionState.PENDING_APPROVAL
    assert action_row(PR_KEY).run_id == again and action_row(PR_KEY).decided_by is None
    assert action_row(PR_KEY).args == args
    decide(PR_KEY, Decision.APPROVE, REVIEWER_ACTOR)
    assert wait_for_status(again, DONE, timeout=60).status == RunStatus.SUCCEEDED
    assert len(opened_pulls(services_up.githost)) == 1


def test_a_run_past_its_deadline_stops_with_that_reason(
    services_up: Services, processes: ProcessFactory
) -> None:
    with transaction() as session:
        started = create_run_txn(session, "follow_up", {"after_seconds": 5})
        session.execute(
            update(Run)
            .where(Run.id == started.run_id)
            .values(deadline=func.now() - timedelta(seconds=1))
        )
    processes("w1")
    row = wait_for_status(started.run_id, DONE, timeout=30)
    assert (row.status, row.stop_reason) == (RunStatus.FAILED, "deadline")


def test_the_stop_signal_passes_through_except_exception() -> None:
    caught = []
    try:
        try:
            raise RunStopped("cancelled", "cancelled by ops")
        except Exception as exc:  # what a careless tool writes
            caught.append(exc)
    except StopStep as stop:
        assert stop.reason == "cancelled"  # type: ignore[attr-defined]
    assert caught == []
