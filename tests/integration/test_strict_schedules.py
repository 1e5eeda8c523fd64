"""Strict schedules (issue 33): a schedules file beat cannot read stops beat at start, naming
the file, the line and the column; `schedules list` fails on it too; a schedule naming an agent
nobody registered is refused before it is stored."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.processes.celery_process import CeleryProcess
from pipeline.runs.schedule_list import active_schedules
from pipeline.tasks import CONFIG_EXIT
from tests.support import nightshift

# A comma missing on line 3 (after "nightly_report"), at column 43.
MALFORMED = """[
  {"name": "every-minute", "minute": "*",
   "params": {"team": "ops"}, "agent": "nightly_report" "missed": "skip"}
]
"""


def _beat_exit(tmp_path: Path, schedules: Path) -> tuple[int, str]:
    """Start a real beat with this schedules file; its exit status and log."""
    beat = CeleryProcess(
        name="beat",
        log_path=tmp_path / "beat.log",
        beat=True,
        env={"NIGHTSHIFT_SCHEDULES_FILE": str(schedules)},
    )
    beat.start(wait=False)
    try:
        assert beat.process is not None
        status = beat.process.wait(timeout=90)
    finally:
        beat.stop()
    return status, beat.log()


def test_a_malformed_schedules_file_stops_beat_and_the_listing(db_url: str, tmp_path: Path) -> None:
    # given a schedules file with a syntax error on line 3
    path = tmp_path / "schedules.json"
    path.write_text(MALFORMED)
    # when beat starts with it, then it stops, saying where, and never starts ticking
    status, log = _beat_exit(tmp_path, path)
    where = f"NIGHTSHIFT_SCHEDULES_FILE={path}, line 3, column 57"
    assert status == CONFIG_EXIT, log
    assert f"beat stops: {where}: not JSON: Expecting ',' delimiter" in log
    assert "Traceback" not in log
    assert active_schedules().stored_by is None
    # and `schedules list` with the same file exits non-zero with the same line
    listing = nightshift("schedules", "list", NIGHTSHIFT_SCHEDULES_FILE=str(path))
    assert listing.returncode == 2, listing.stdout
    assert listing.stderr.strip().splitlines() == [
        f"nightshift: {where}: not JSON: Expecting ',' delimiter"
    ]
    assert listing.stdout == ""


def test_a_misspelt_field_names_its_entry_and_stops_beat(db_url: str, tmp_path: Path) -> None:
    # given a valid JSON file whose second entry says "hours" for "hour"
    entries = [
        {"name": "every-minute", "agent": "nightly_report", "minute": "*"},
        {"name": "late-report", "agent": "nightly_report", "hours": "3"},
    ]
    path = tmp_path / "schedules.json"
    path.write_text("[\n" + ",\n".join("  " + json.dumps(e) for e in entries) + "\n]\n")
    # when beat starts, then it stops at the entry's line and column, naming the field
    status, log = _beat_exit(tmp_path, path)
    assert status == CONFIG_EXIT, log
    assert f"NIGHTSHIFT_SCHEDULES_FILE={path}, line 3, column 3: schedule 'late-report': " in log
    assert "unknown field 'hours'" in log
    assert active_schedules().stored_by is None


def test_a_schedule_naming_an_unregistered_agent_is_refused(db_url: str, tmp_path: Path) -> None:
    # given a well-formed schedule for an agent no package registers
    path = tmp_path / "schedules.json"
    path.write_text(json.dumps([{"name": "triage", "agent": "acme_triage", "minute": "*/5"}]))
    # when beat starts, then it refuses to store it and stops, in one line naming both
    status, log = _beat_exit(tmp_path, path)
    assert status == CONFIG_EXIT, log
    refusal = [line for line in log.splitlines() if "beat stops:" in line]
    assert len(refusal) == 1, log
    assert "schedule 'triage' names agent 'acme_triage', which is not registered" in refusal[0]
    assert active_schedules().stored_by is None
