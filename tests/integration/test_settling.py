"""A person's resolution of an `action:` wait that lands while the run is parking for it is not
lost (finding 6a), with a real worker stopped at that instant: the park, in the one wake path
(pipeline/runs/waits.py), sees the decision. The other stuck cases of finding 6: an unknown
outcome of a cancelled run (test_waiting.py) and `cancel_other` on a batch
(test_schedules.py)."""

from __future__ import annotations

import signal

import psutil
import pytest

from models import ActionState, RunStatus
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.start import start_run
from pipeline.runs.tick import tick
from tests.integration.api_fixtures import action_row
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import run_row, wait_for, wait_for_status

REPORT = {"team": "ops", "date": "2026-11-29"}
REPORT_KEY = "nightly_report:2026-11-29:ops"


def stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


def test_a_resolution_made_while_the_run_parks_for_it_is_not_lost(
    sandbox: Sandbox, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given an email API that neither honours keys nor can be asked, and a worker that dies
    # after the email went out and before its reply was saved
    sandbox.email.mode = "no-keys"
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", "none")
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_send_before_reply"})
    run_id = start_run("nightly_report", REPORT).run_id
    wait_for(doomed.exited, timeout=60, what="the worker to die mid-send")
    assert len(sandbox.email.deliveries(REPORT_KEY)) == 1

    # when the next worker finds the unknown outcome and is about to park the run for a person
    # (a pause point stops it right there; no beat runs, so no tick will come to the rescue)
    pausing = processes("pausing", env={"NIGHTSHIFT_PAUSE_POINTS": "before_park"})

    def paused() -> bool:
        if stopped(pausing.pid):
            return True
        tick()  # hands the dead worker's run on once its lease has run out
        return False

    wait_for(paused, timeout=60, interval=1.0, what="the worker to stop before parking")
    assert action_row(REPORT_KEY).state == ActionState.OUTCOME_UNKNOWN
    assert run_row(run_id).status == RunStatus.RUNNING

    # and a person who checked the mailbox says it happened, before the park commits: the
    # decision's wake finds the run still running and wakes nothing
    found = decide(REPORT_KEY, Decision.HAPPENED, Actor("oncall@example.com", "test"))
    assert found.first
    pausing.signal(signal.SIGCONT)

    # then the park sees the decision and replays the step instead of waiting for ever
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}, 30)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert len(sandbox.email.deliveries(REPORT_KEY)) == 1
    assert "was decided before the run parked; replaying" in pausing.log()
