"""The schedules beat fires by reach every process: beat stores them when it starts, a worker
without the schedules file checks them, and `schedules list` shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from models import FireDecision, Run, ScheduleFire
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.runs.schedule_list import active_schedules, load_schedules, store_for_beat
from pipeline.slots import Schedule
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for

EVERY_MINUTE = {
    "name": "every-minute",
    "agent": "nightly_report",
    "minute": "*",
    "params": {"team": "ops"},
    "missed": "skip",
    "overlap": "allow",
    "deadline_minutes": 30,
}


def test_a_schedule_reads_back_from_its_entry_unchanged() -> None:
    schedule = Schedule.from_json(EVERY_MINUTE | {"timezone": "Europe/Berlin"})
    assert Schedule.from_json(schedule.to_json()) == schedule


def test_what_beat_stored_is_what_is_checked_and_listed(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given this process's own schedules (the shipped ones, all off in tests)
    assert active_schedules().stored_by is None
    # when a beat stores a different set
    store_for_beat((Schedule.from_json(EVERY_MINUTE),), "beat-host:4242")
    # then those are the ones that fire and are listed, with who stored them
    active = active_schedules()
    assert [s.name for s in active.schedules] == ["every-minute"]
    assert active.stored_by == "beat-host:4242"
    assert load_schedules() != active.schedules
    assert main(["schedules", "list"]) == 0
    out = capsys.readouterr().out
    assert "every-minute" in out and "as beat beat-host:4242 stored them" in out


def test_a_worker_without_the_schedules_file_fires_what_beat_has(
    db_url: str, processes: ProcessFactory, tmp_path: Path
) -> None:
    # given a schedules file that only beat has (the worker keeps the tests' all-off file)
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps([EVERY_MINUTE]))
    worker = processes("w1")
    processes(
        "beat",
        beat=True,
        env={"NIGHTSHIFT_SCHEDULES_FILE": str(path), "NIGHTSHIFT_SCHEDULE_CHECK_SECONDS": "1"},
    )
    # when the next minute's slot comes, then the worker fired it and a run started
    fired = wait_for(lambda: _fired("every-minute"), timeout=90, what="a fired slot")
    assert fired.decision is FireDecision.FIRED and fired.run_id is not None
    with transaction() as session:
        run = session.scalar(select(Run).where(Run.id == fired.run_id))
    assert run is not None and run.agent == "nightly_report"
    assert "pipeline.fire_schedules" in worker.log()


def _fired(schedule: str) -> ScheduleFire | None:
    with transaction() as session:
        return session.scalar(select(ScheduleFire).where(ScheduleFire.schedule == schedule))
