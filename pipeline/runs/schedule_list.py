"""The schedule list: the shipped SCHEDULES of beat_schedule.py whose agents run here (a
shipped agent is off until NIGHTSHIFT_SHIPPED_AGENTS names it, and its schedule with it), with
the schedules file's additions and overrides.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from json.decoder import JSONObject  # type: ignore[attr-defined]
from json.scanner import py_make_scanner  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from sqlalchemy import func
from sqlalchemy.dialects.postgresql import insert

from beat_schedule import SCHEDULES
from models import BeatSchedules
from pipeline.db import transaction
from pipeline.errors import ScheduleError, UnknownSchedule
from pipeline.registry import SHIPPED_ENV, agent_names, registry
from pipeline.settings import get_settings
from pipeline.slots import Schedule

SCHEDULES_FILE_ENV = "NIGHTSHIFT_SCHEDULES_FILE"


def load_schedules(path: str | Path | None = None) -> tuple[Schedule, ...]:
    """The shipped schedules, with the schedules file's additions and overrides. A file that is
    not what the module docstring says is a ScheduleError naming it, the line and the column."""
    path = path or get_settings().schedules_file
    if not path:
        return shipped_schedules()
    where = f"{SCHEDULES_FILE_ENV}={path}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ScheduleError(f"{where} cannot be read: {exc.strerror or exc}") from None
    located = _LocatedObjects()
    try:
        data = located.decode(text)
    except json.JSONDecodeError as exc:
        raise ScheduleError(
            f"{where}, line {exc.lineno}, column {exc.colno}: not JSON: {exc.msg}"
        ) from None
    entries = data.get("schedules") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ScheduleError(
            f'{where}, line 1, column 1: must hold a list of objects or {{"schedules": [...]}}'
        )
    merged = {schedule.name: schedule for schedule in shipped_schedules()}
    for entry in entries:
        at = f"{where}, {located.position(text, entry)}"
        name = entry.get("name")
        if not isinstance(name, str):
            raise ScheduleError(f"{at}: an entry has no name")
        try:
            if entry.get("enabled", True) is False:
                merged.pop(name, None)
            else:
                # A shipped schedule whose agent is off is still the base of an override: its
                # agent is then refused by name at store time (refuse_unregistered).
                base = merged.get(name) or _SHIPPED.get(name)
                merged[name] = Schedule.from_json(entry, base=base)
        except ScheduleError as exc:
            raise ScheduleError(f"{at}: {exc}") from None
    return tuple(merged.values())


_SHIPPED = {schedule.name: schedule for schedule in SCHEDULES}


def shipped_schedules() -> tuple[Schedule, ...]:
    """The shipped schedules whose agents are registered here."""
    known = set(agent_names())
    return tuple(schedule for schedule in SCHEDULES if schedule.agent in known)


class _LocatedObjects(json.JSONDecoder):
    """A JSON decoder that remembers where each object began, so an entry's error can name its
    line and column (the stdlib says where only for a syntax error)."""

    def __init__(self) -> None:
        super().__init__()
        self._starts: dict[int, int] = {}
        self._objects: list[object] = []  # alive, so no id() is reused while we look them up
        plain: Callable[..., tuple[Any, int]] = JSONObject

        def parse_object(s_and_end: tuple[str, int], *args: Any) -> tuple[Any, int]:
            value, end = plain(s_and_end, *args)
            self._starts[id(value)] = s_and_end[1] - 1
            self._objects.append(value)
            return value, end

        self.parse_object = parse_object
        self.scan_once = py_make_scanner(self)  # the C scanner would not call parse_object

    def position(self, text: str, value: object) -> str:
        offset = self._starts.get(id(value), 0)
        line = text.count("\n", 0, offset) + 1
        return f"line {line}, column {offset - text.rfind(chr(10), 0, offset)}"


@dataclass(frozen=True)
class ActiveSchedules:
    """The schedules that fire, and where they come from."""

    schedules: tuple[Schedule, ...]
    stored_by: str | None
    """The beat that stored them (host and pid), or None: this process's own."""
    stored_at: datetime | None


def refuse_unregistered(schedules: Iterable[Schedule]) -> None:
    """A schedule naming an agent this process does not have would fail every slot at night:
    it is refused before it is stored."""
    known = agent_names()
    for schedule in schedules:
        if schedule.agent in registry().shipped_off:
            raise ScheduleError(
                f"schedule {schedule.name!r} names agent {schedule.agent!r}, one of "
                f"nightshift's shipped agents, off here: set {SHIPPED_ENV}={schedule.agent} "
                f"(or all), or turn the schedule off in {SCHEDULES_FILE_ENV}"
            )
        if schedule.agent not in known:
            raise ScheduleError(
                f"schedule {schedule.name!r} names agent {schedule.agent!r}, which is not "
                f"registered (registered: {', '.join(known) or 'none'}); install its package "
                f"or set NIGHTSHIFT_AGENTS, or turn the schedule off in {SCHEDULES_FILE_ENV}"
            )


def store_for_beat(schedules: tuple[Schedule, ...], stored_by: str) -> None:
    """Beat, at start: the definitions it fires by become the ones every worker checks and
    every `schedules list` shows, whether or not those processes have the schedules file.
    Refused (ScheduleError, nothing stored) if one names an agent that is not registered."""
    refuse_unregistered(schedules)
    definitions = [schedule.to_json() for schedule in schedules]
    row = {"id": 1, "definitions": definitions, "stored_by": stored_by}
    upsert = insert(BeatSchedules).values(row)
    upsert = upsert.on_conflict_do_update(
        index_elements=[BeatSchedules.id],
        set_={"definitions": definitions, "stored_by": stored_by, "stored_at": func.now()},
    )
    with transaction() as session:
        session.execute(upsert)


def active_schedules() -> ActiveSchedules:
    """What fires: the definitions beat stored when it started; before any beat did, this
    process's own (the shipped schedules and its schedules file)."""
    with transaction() as session:
        row = session.get(BeatSchedules, 1)
        if row is None:
            return ActiveSchedules(load_schedules(), None, None)
        stored = tuple(Schedule.from_json(entry) for entry in row.definitions)
        return ActiveSchedules(stored, row.stored_by, row.stored_at)


def find_schedule(name: str, schedules: Iterable[Schedule] | None = None) -> Schedule:
    known = {s.name: s for s in (active_schedules().schedules if schedules is None else schedules)}
    try:
        return known[name]
    except KeyError:
        raise UnknownSchedule(f"no schedule {name!r}; known: {', '.join(known)}") from None
