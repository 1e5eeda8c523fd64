"""Sends slower than the lease, on real workers: a side effect declares how long one send may
take (SideEffect.send_timeout), the step's lease covers that before anything is sent, and a send
past it is cut off by the tool's own client and becomes an unknown outcome.

Scaled from the issue (a service answering in 40 s, a lease of 15 s): the tests run with
NIGHTSHIFT_LEASE_SECONDS=4, the email service answers in 10 s (two and a half leases) and
`slow_sender` declares 15 s; `hasty_sender` declares 2 s, so the same service overruns it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import select

from models import Action, ActionState, RunStatus
from pipeline.db import transaction
from pipeline.runs.start import start_run
from pipeline.sandbox.email import EmailSandbox
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import run_row, wait_for, wait_for_status

SLOW_SENDER = "tests.fixture_slow_sends:SLOW_SENDER"
HASTY_SENDER = "tests.fixture_slow_sends:HASTY_SENDER"
SERVICE_SECONDS = 10.0
SETTLED = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.NEEDS_ATTENTION.value}


def action_of(run_id: uuid.UUID) -> Action:
    with transaction() as session:
        action = session.scalar(select(Action).where(Action.run_id == run_id))
    assert action is not None, "the run recorded no action"
    return action


@pytest.fixture
def slow_email(
    sandbox: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str], EmailSandbox]:
    """Both agents registered and the tick running; called with a mode, the email API in it,
    answering each send SERVICE_SECONDS after it acted."""
    register_agents(SLOW_SENDER, HASTY_SENDER)
    processes("beat", beat=True)

    def in_mode(mode: str) -> EmailSandbox:
        sandbox.email.mode = mode  # type: ignore[assignment]
        monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", {"no-keys": "none"}.get(mode, "lookup"))
        sandbox.email.delay_seconds = SERVICE_SECONDS
        return sandbox.email

    return in_mode


def test_a_send_slower_than_the_lease_goes_out_once_with_no_takeover(
    slow_email: Callable[[str], EmailSandbox],
    processes: ProcessFactory,
    duplicate_report: list[int],
) -> None:
    # given a service that keeps no keys (a second send would be a second email), answering in
    # two and a half leases, two workers and the tick
    email = slow_email("no-keys")
    workers = [processes("first"), processes("second")]

    # when the run sends its alert
    run_id = start_run("slow_sender", {"name": "slow"}).run_id
    row = wait_for_status(run_id, SETTLED, timeout=90)

    # then it was sent once, by the one attempt that started it, and nothing was reconciled
    delivered = len(email.deliveries("slow_sender:alert:slow"))
    duplicate_report.append(max(0, delivered - 1))
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert delivered == 1
    action = action_of(run_id)
    assert action.state == ActionState.CONFIRMED
    assert (action.attempts, action.resolution) == (1, None)
    assert run_row(run_id).failed_attempts == 0, "another worker took the run over mid-send"
    logs = "".join(worker.log() for worker in workers)
    assert "Traceback" not in logs
    assert "outcome unknown" not in logs
    assert "past its send_timeout" not in logs


def test_a_worker_killed_mid_send_still_ends_in_one_email(
    slow_email: Callable[[str], EmailSandbox],
    processes: ProcessFactory,
    duplicate_report: list[int],
) -> None:
    # given a slow service that can say what it sent under a key, and a worker mid-send
    email = slow_email("no-keys-lookup")
    doomed = processes("doomed")
    run_id = start_run("slow_sender", {"name": "killed"}).run_id
    key = "slow_sender:alert:killed"
    wait_for(lambda: email.deliveries(key), timeout=60, what="the email to be sent")

    # when that worker is killed while it waits for the reply, and another one takes over
    doomed.kill()
    healthy = processes("healthy")
    row = wait_for_status(run_id, SETTLED, timeout=90)

    # then the takeover asked the service instead of sending again: one email
    delivered = len(email.deliveries(key))
    duplicate_report.append(max(0, delivered - 1))
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert delivered == 1
    action = action_of(run_id)
    assert (action.state, action.resolution) == (ActionState.CONFIRMED, "lookup")
    assert "Traceback" not in healthy.log()


def test_a_send_past_its_declared_time_is_cut_off_as_an_unknown_outcome(
    slow_email: Callable[[str], EmailSandbox], processes: ProcessFactory
) -> None:
    # given a service slower than the 2 s the side effect declares, keeping no keys
    email = slow_email("no-keys")
    worker = processes("worker")

    # when the run sends its alert
    run_id = start_run("hasty_sender", {"name": "hasty"}).run_id
    row = wait_for_status(run_id, SETTLED, timeout=60)

    # then its client gave up at 2 s: the outcome is unknown, a person is asked, one log line
    assert row.status == RunStatus.NEEDS_ATTENTION, row.error
    action = action_of(run_id)
    assert action.state == ActionState.OUTCOME_UNKNOWN
    assert len(email.deliveries("hasty_sender:alert:hasty")) == 1  # it did act
    log = worker.log()
    cut_off = [line for line in log.splitlines() if "no reply within its send_timeout" in line]
    assert len(cut_off) == 1, cut_off
    assert "send_timeout of 2s" in cut_off[0]
    assert "Traceback" not in log
