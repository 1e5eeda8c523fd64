"""Side effects exactly once: a crash at every point of the action protocol, in every mode of
the email API, ends with exactly one email (or a run waiting for a person, and no duplicate)."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select, text, update

from models import Action, ActionState, RunStatus
from pipeline.db import transaction
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.start import start_run
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import run_row, wait_for, wait_for_status

RUN_INPUT = {"team": "ops", "date": "2026-11-29"}
KEY = "nightly_report:2026-11-29:ops"
SETTLED = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.NEEDS_ATTENTION.value}
CRASH_POINTS = [
    "after_intended",
    "after_attempted",
    "after_send_before_reply",
    "after_confirmed",
    "before_checkpoint",
    "after_checkpoint_before_enqueue",
]
# email API mode in the sandbox -> how nightshift is told the deployed API behaves
MODES = {"keys": "keys", "no-keys-lookup": "lookup", "no-keys": "none"}


def action_row() -> Action | None:
    with transaction() as session:
        return session.scalar(select(Action).where(Action.idempotency_key == KEY))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_anywhere_sends_the_report_email_exactly_once(
    point: str,
    mode: str,
    sandbox: Sandbox,
    processes: ProcessFactory,
    monkeypatch: pytest.MonkeyPatch,
    duplicate_report: list[int],
) -> None:
    # given the email API in this mode, and a worker that dies at this crash point
    sandbox.email.mode = mode  # type: ignore[assignment]
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", MODES[mode])
    processes("beat", beat=True)
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": point})
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    wait_for(doomed.exited, timeout=60, what=f"the worker to die at {point}")

    # when a healthy worker picks the run up
    processes("healthy")
    row = wait_for_status(run_id, SETTLED, timeout=60)
    delivered = len(sandbox.email.deliveries(KEY))

    # then either one email went out, or a person is asked and nothing was sent twice
    if row.status == RunStatus.NEEDS_ATTENTION:
        assert mode == "no-keys", f"only a service that cannot tell needs a person ({mode})"
        assert delivered <= 1
        action = action_row()
        assert action is not None and action.state == ActionState.OUTCOME_UNKNOWN
        # a person checks the mailbox and says what they found
        verdict = Decision.HAPPENED if delivered else Decision.DID_NOT_HAPPEN
        decide(KEY, verdict, Actor("oncall@example.com", "test"), note="checked the mailbox")
        row = wait_for_status(run_id, SETTLED - {RunStatus.NEEDS_ATTENTION.value}, timeout=60)
        delivered = len(sandbox.email.deliveries(KEY))
    assert row.status == RunStatus.SUCCEEDED, row.error
    duplicate_report.append(max(0, delivered - 1))
    assert delivered == 1
    action = action_row()
    assert action is not None and action.state == ActionState.CONFIRMED


def test_thirty_hours_later_the_run_reconciles_instead_of_resending(
    sandbox: Sandbox,
    processes: ProcessFactory,
    monkeypatch: pytest.MonkeyPatch,
    duplicate_report: list[int],
) -> None:
    # given a service that honours keys for 24 h and offers lookup, and a send whose reply was lost
    sandbox.email.mode = "keys"
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", "keys")
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_send_before_reply"})
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    wait_for(doomed.exited, timeout=60, what="the worker to die after the send")
    assert len(sandbox.email.deliveries(KEY)) == 1

    # when the run resumes thirty hours later (both clocks move; nobody sleeps)
    httpx.post(f"{sandbox.email.url}/_control/advance", json={"seconds": 30 * 3600})
    with transaction() as session:
        session.execute(
            update(Action)
            .where(Action.idempotency_key == KEY)
            .values(first_attempt_at=Action.first_attempt_at - text("interval '30 hours'"))
        )
    processes("beat", beat=True)
    processes("healthy")
    row = wait_for_status(run_id, SETTLED, timeout=60)

    # then it asked the service instead of resending past the key's retention window
    assert row.status == RunStatus.SUCCEEDED, row.error
    action = action_row()
    assert action is not None and action.resolution == "lookup"
    duplicate_report.append(len(sandbox.email.deliveries(KEY)) - 1)
    assert len(sandbox.email.deliveries(KEY)) == 1


def test_a_worker_frozen_mid_send_cannot_confirm_after_a_takeover(
    sandbox: Sandbox,
    processes: ProcessFactory,
    monkeypatch: pytest.MonkeyPatch,
    duplicate_report: list[int],
) -> None:
    import signal

    # given a slow email API (the send is in flight for 2 s) in lookup mode
    sandbox.email.mode = "no-keys-lookup"
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", "lookup")
    sandbox.email.delay_seconds = 2.0
    first = processes("first")
    processes("beat", beat=True)
    run_id = start_run("nightly_report", RUN_INPUT).run_id

    # when the worker freezes while its email is in flight, past its lease
    wait_for(lambda: sandbox.email.deliveries(KEY), timeout=60, what="the email to be sent")
    first.signal(signal.SIGSTOP)
    second = processes("second")
    row = wait_for_status(run_id, SETTLED, timeout=90)
    first.signal(signal.SIGCONT)

    # then the second worker finished with one email, and the first could not confirm it again
    assert row.status == RunStatus.SUCCEEDED, row.error
    # (refused by the fence, or PostgreSQL ended its session while it was frozen mid-send)
    refusals = ("stopping without writing", "IdleInTransactionSessionTimeout")
    wait_for(lambda: any(r in first.log() for r in refusals), timeout=30,
             what="the frozen worker's confirmation to be refused")  # fmt: skip
    action = action_row()
    assert action is not None and action.resolution == "lookup"
    duplicate_report.append(len(sandbox.email.deliveries(KEY)) - 1)
    assert len(sandbox.email.deliveries(KEY)) == 1
    assert run_row(run_id).fence >= 2
    assert second.pid != first.pid
