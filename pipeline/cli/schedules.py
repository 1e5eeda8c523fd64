"""`nightshift schedules list | fire | check`: each schedule in words, its next slot and what
its slots decided (from schedule_fires)."""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from models import ScheduleFire
from pipeline.cli.format import print_json, table
from pipeline.db import transaction
from pipeline.errors import NightshiftError
from pipeline.registry import agent_names
from pipeline.runs.schedule_list import ActiveSchedules, active_schedules, load_schedules
from pipeline.runs.schedules import check_schedules, fire
from pipeline.runs.schedules import log as decisions_log

if TYPE_CHECKING:
    from pipeline.cli.main import AddCommand
    from pipeline.runs.schedules import Decision
    from pipeline.slots import Schedule


def register(add: AddCommand) -> None:
    command = add("schedules", cmd_schedules, "list the schedules, or fire a slot by hand")
    verbs = command.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser(
        "list", help="when each schedule fires, its next slot, last decision"
    )
    fire = verbs.add_parser(
        "fire", help="fire a slot now (default: the latest); a recorded slot starts nothing"
    )
    fire.add_argument("name", help="schedule name, as in `nightshift schedules list`")
    fire.add_argument(
        "--slot",
        help="the slot as ISO time, e.g. 2026-11-30T02:00; without an offset it is read in "
        "the schedule's timezone",
    )
    check = verbs.add_parser("check", help="check every schedule once now (beat does this)")
    for verb in (listing, fire, check):
        verb.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_schedules(args: argparse.Namespace) -> int:
    handler = {"list": cmd_list, "fire": cmd_fire, "check": cmd_check}[args.verb]
    # fire and check print each decision themselves; beat's and the workers' log line for it
    # would say it a second time.
    level = decisions_log.level
    decisions_log.setLevel(logging.WARNING)
    try:
        return handler(args)
    finally:
        decisions_log.setLevel(level)


def cmd_list(args: argparse.Namespace) -> int:
    # What beat stored is listed, but a schedules file here that beat would refuse is an error
    # here too (a ScheduleError: one line, exit 2), not a table that looks fine.
    load_schedules()
    active = active_schedules()
    rows = schedule_rows(datetime.now(UTC), active)
    if args.json:
        print_json(rows)
        return 0
    lines = [
        (
            r["name"],
            r["when"],
            r["timezone"],
            r["agent"] + ("" if r["agent_registered"] else " (not registered)"),
            f"missed={r['missed']} overlap={r['overlap']}"
            + ("" if r["deadline_minutes"] is None else f" deadline={r['deadline_minutes']:g}m"),
            r["next_slot"] or "never",
            _last_words(r["last"]),
        )
        for r in rows
    ]
    headers = ["schedule", "when", "timezone", "agent", "policies", "next slot", "last decision"]
    print(table(lines, headers))
    print(_source_words(active))
    return 0


def _source_words(active: ActiveSchedules) -> str:
    if active.stored_by is None or active.stored_at is None:
        return "(this process's schedules: no beat has stored the ones it fires by yet)"
    return f"(as beat {active.stored_by} stored them at {active.stored_at:%Y-%m-%d %H:%M:%S %Z})"


def cmd_fire(args: argparse.Namespace) -> int:
    slot = None
    if args.slot:
        try:
            slot = datetime.fromisoformat(args.slot)
        except ValueError:
            raise NightshiftError(f"--slot {args.slot!r} is not an ISO date and time") from None
    decision = fire(args.name, now=datetime.now(UTC), slot=slot)
    if args.json:
        print_json(_decision_dict(decision))
    elif decision.duplicate:
        print(
            f"slot {decision.slot.isoformat()} of {decision.schedule} was already recorded: "
            f"{decision.decision} ({_started(decision)}); nothing new started "
            f"(asked again {decision.duplicates} time(s))"
        )
    else:
        print(f"slot {decision.slot.isoformat()} of {decision.schedule}: {decision.decision}")
        print(f"  {_started(decision)}; {decision.reason}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    report = check_schedules(now=datetime.now(UTC))
    if args.json:
        print_json(
            {"decisions": [_decision_dict(d) for d in report.decisions], "errors": report.errors}
        )
    else:
        for d in report.decisions:
            print(f"{d.schedule}  {d.slot.isoformat()}  {d.decision}  {d.reason}")
        for name, error in report.errors.items():
            print(f"nightshift: schedule {name}: {error}", file=sys.stderr)
        if not report.decisions and not report.errors:
            print("no slot is due")
    return 1 if report.errors else 0


def schedule_rows(now: datetime, active: ActiveSchedules) -> list[dict[str, Any]]:
    """Every schedule that fires, with its policies, next slot and latest recorded decision."""
    schedules = active.schedules
    known = set(agent_names())
    latest = select(ScheduleFire).order_by(ScheduleFire.slot.desc()).limit(1)
    with transaction() as session:
        last = {
            s.name: session.scalar(latest.where(ScheduleFire.schedule == s.name)) for s in schedules
        }
    rows = []
    for schedule in schedules:
        upcoming = schedule.next_slot(now)
        fire = last[schedule.name]
        rows.append(
            {
                "name": schedule.name,
                "when": schedule.describe(),
                "timezone": schedule.timezone.key,
                "agent": schedule.agent,
                "agent_registered": schedule.agent in known,
                "params": dict(schedule.params),
                "missed": schedule.missed.value,
                "catch_up_minutes": schedule.catch_up.total_seconds() / 60,
                "overlap": schedule.overlap.value,
                "deadline_minutes": (
                    None if schedule.deadline is None else schedule.deadline.total_seconds() / 60
                ),
                "next_slot": _local(schedule, upcoming) if upcoming else None,
                "last": None if fire is None else _fire_dict(schedule, fire),
            }
        )
    return rows


def _fire_dict(schedule: Schedule, fire: ScheduleFire) -> dict[str, Any]:
    return {
        "slot": _local(schedule, fire.slot),
        "decision": fire.decision.value,
        "reason": fire.reason,
        "run_id": str(fire.run_id) if fire.run_id else None,
        "batch_id": fire.batch_id,
        "duplicates": fire.duplicates,
    }


def _decision_dict(decision: Decision) -> dict[str, Any]:
    return {
        "schedule": decision.schedule,
        "slot": decision.slot.isoformat(),
        "decision": decision.decision.value,
        "reason": decision.reason,
        "run_id": str(decision.run_id) if decision.run_id else None,
        "batch_id": decision.batch_id,
        "duplicates": decision.duplicates,
        "duplicate": decision.duplicate,
    }


def _local(schedule: Schedule, instant: datetime) -> str:
    return schedule.local(instant).strftime("%Y-%m-%d %H:%M %Z")


def _started(decision: Decision) -> str:
    if decision.batch_id:
        return f"batch {decision.batch_id}"
    return f"run {decision.run_id}" if decision.run_id else "no run"


def _last_words(last: dict[str, Any] | None) -> str:
    if last is None:
        return "-"
    what = last["batch_id"] or (last["run_id"] or "")[:8] or "no run"
    again = f", asked again {last['duplicates']}x" if last["duplicates"] else ""
    return f"{last['decision']} {last['slot']} ({what}{again})"
