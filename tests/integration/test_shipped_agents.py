"""nightshift's own agents and their schedules are off in a deployment until
NIGHTSHIFT_SHIPPED_AGENTS names them: a worker runs and warns about none of them, beat stores
none of their schedules, and starting one says how to turn it on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from models import BeatSchedules
from pipeline.db import transaction
from pipeline.errors import ScheduleError
from pipeline.processes.celery_process import wait_for
from pipeline.registry import _declared, build, registry
from pipeline.runs.schedule_list import load_schedules, refuse_unregistered
from tests.integration.conftest import ProcessFactory
from tests.support import nightshift

FRESH = {"NIGHTSHIFT_SHIPPED_AGENTS": "", "NIGHTSHIFT_SCHEDULES_FILE": ""}
"""A deployment as installed: nothing named, no schedules file."""


def test_a_fresh_deployment_runs_no_shipped_agent_and_fires_no_shipped_schedule(
    db_url: str, processes: ProcessFactory
) -> None:
    # given a worker and beat configured as a fresh deployment
    worker = processes("w1", env=FRESH)
    beat = processes("beat", beat=True, env=FRESH)

    # then the worker lists only the agents registered here, and warns about none
    registered = "agents registered on this worker: bench, bench_synthesis\n"
    wait_for(lambda: registered in worker.log(), timeout=30, what="the worker's agents")
    assert "nightly_report" not in worker.log() and "WARNING" not in worker.log()
    # and beat stores no schedule for anyone to fire
    wait_for(lambda: "beat stored its 0 schedules" in beat.log(), timeout=30, what="beat")
    with transaction() as session:
        assert session.scalar(select(BeatSchedules.definitions)) == []
    # and `nightshift agents` says which are off and how to turn them on
    listed = nightshift("agents", **FRESH).stdout
    assert listed.endswith(
        "nightshift's shipped agents off here: competitor_monitor, follow_up, invoice_reminders, "
        "nightly_report, patch, price_synthesis (turn them on with NIGHTSHIFT_SHIPPED_AGENTS=all "
        "or their names)\n"
    )
    # and starting a shipped agent says how to turn it on, in one line
    started = nightshift(
        "start", "nightly_report", "--input", '{"team": "ops", "date": "2026-11-29"}', **FRESH
    )
    assert (started.returncode, started.stdout) == (2, "")
    assert started.stderr == (
        "nightshift: agent 'nightly_report' is one of nightshift's shipped agents, off here: "
        "set NIGHTSHIFT_SHIPPED_AGENTS=nightly_report (or all) where it should run\n"
    )


def test_a_named_shipped_agent_brings_its_schedule(tmp_path: Path) -> None:
    # given a deployment that turns the nightly report on, with a schedules file of its own
    named = build(*_declared("", frozenset({"nightly_report"})))
    path = tmp_path / "schedules.json"
    with registry.replaced_by(named):
        # then the nightly report's schedule fires, not the other shipped ones
        path.write_text("[]")
        assert [s.name for s in load_schedules(path)] == ["nightly-report-ops"]
        # and moving the schedule of a shipped agent left off is refused, saying how
        path.write_text(json.dumps([{"name": "competitor-monitor", "hour": "3"}]))
        with pytest.raises(ScheduleError) as refused:
            refuse_unregistered(load_schedules(path))
    assert str(refused.value) == (
        "schedule 'competitor-monitor' names agent 'competitor_monitor', one of nightshift's "
        "shipped agents, off here: set NIGHTSHIFT_SHIPPED_AGENTS=competitor_monitor (or all), "
        "or turn the schedule off in NIGHTSHIFT_SCHEDULES_FILE"
    )
