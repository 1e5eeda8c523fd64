"""The schedule list: the shipped SCHEDULES of beat_schedule.py, with the schedules file's
additions and overrides.

The schedules file, named by NIGHTSHIFT_SCHEDULES_FILE, is JSON: a list of entries, or
{"schedules": [...]}:

    {"schedules": [
      {"name": "minutely-report", "agent": "nightly_report", "minute": "*",
       "timezone": "Europe/Berlin", "params": {"team": "ops"},
       "missed": "skip", "catch_up_minutes": 30, "overlap": "allow"},
      {"name": "nightly-report-ops", "hour": "3"},
      {"name": "invoice-reminders", "enabled": false}
    ]}

An entry named like a shipped schedule overrides only the fields it gives; `"enabled": false`
turns a schedule off. Fields: name, agent (any registered agent; `job` is read as its old
name), minute, hour, day_of_week (0 or sun is Sunday), day_of_month, month_of_year (cron
syntax: `*`, `5`, `1-5`, `*/15`, `mon-fri`, lists with commas; all fields must match), timezone
(an IANA name; default UTC), params (an object for the agent's job; by default the run's
input), missed (skip | once | all; default once), catch_up_minutes (default 360), overlap
(allow | skip | buffer_one | cancel_other; default skip), deadline_minutes (the slot's run, or
every run of its batch, must be finished this long after the slot; default none), notify_url
(told when the slot's run or batch ends or waits for a person; default none).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from beat_schedule import SCHEDULES
from pipeline.errors import NightshiftError
from pipeline.settings import get_settings
from pipeline.slots import Schedule, ScheduleError

SCHEDULES_FILE_ENV = "NIGHTSHIFT_SCHEDULES_FILE"


class UnknownSchedule(NightshiftError):
    """No schedule has that name."""


def load_schedules(path: str | Path | None = None) -> tuple[Schedule, ...]:
    """The shipped schedules, with the schedules file's additions and overrides."""
    path = path or get_settings().schedules_file
    if not path:
        return SCHEDULES
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ScheduleError(f"{SCHEDULES_FILE_ENV}={path} cannot be read: {exc}") from None
    entries = data.get("schedules") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ScheduleError(f"{SCHEDULES_FILE_ENV}={path} must hold a list of objects")
    merged = {schedule.name: schedule for schedule in SCHEDULES}
    for entry in entries:
        name = entry.get("name")
        if not isinstance(name, str):
            raise ScheduleError(f"{SCHEDULES_FILE_ENV}={path}: an entry has no name")
        if entry.get("enabled", True) is False:
            merged.pop(name, None)
        else:
            merged[name] = Schedule.from_json(entry, base=merged.get(name))
    return tuple(merged.values())


def find_schedule(name: str, schedules: Iterable[Schedule] | None = None) -> Schedule:
    known = {s.name: s for s in (load_schedules() if schedules is None else schedules)}
    try:
        return known[name]
    except KeyError:
        raise UnknownSchedule(f"no schedule {name!r}; known: {', '.join(known)}") from None
