"""Durable timers: a run that must check back later is parked with a wake-up time, holding no
worker and no broker message; the tick wakes it. Never a long Celery countdown."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from models import RunStatus
from pipeline import journal as jr
from pipeline.actions import ParkRun
from pipeline.leases import Lease, fenced
from pipeline.tools import Tool, ToolContext, tool

MAX_WAIT = timedelta(days=30)


def timer_key(tool_use_id: str) -> str:
    return f"timer:{tool_use_id}"


def await_timer(
    tool_: Tool, block: dict[str, Any], lease: Lease, step: int, journal: jr.Journal
) -> None:
    """Park the run until the tool's wake time; return once that time has passed.

    The wake time is journaled the first time, so a replay waits for the same instant.
    """
    assert tool_.wake_time is not None
    key = timer_key(block["id"])
    with fenced(lease) as session:
        now = session.scalar(select(func.now()))
        assert now is not None
        recorded = journal.replay(key, tool_.name)
        if recorded is None:
            wake_at = tool_.wake_time(block["input"], now)
            journal.append_txn(session, key, step, tool_.name, {"wake_at": wake_at.isoformat()})
        else:
            wake_at = datetime.fromisoformat(recorded["wake_at"])
    if wake_at > now:
        raise ParkRun(RunStatus.WAITING, f"timer:{block['id']}", wake_at=wake_at)


def _after(args: dict[str, Any], now: datetime) -> datetime:
    if "until" in args:
        return min(datetime.fromisoformat(args["until"]), now + MAX_WAIT)
    return now + timedelta(seconds=args["seconds"])


@tool(
    description=(
        "Pause this run and continue later: either after `seconds`, or at `until` (an ISO-8601 "
        "time with a timezone). Nothing runs while waiting. Returns when the time has come."
    ),
    schema={
        "type": "object",
        "properties": {
            "seconds": {"type": "integer", "minimum": 1, "maximum": int(MAX_WAIT.total_seconds())},
            "until": {"type": "string", "format": "date-time", "pattern": r"(Z|[+-]\d\d:\d\d)$"},
            "reason": {"type": "string", "maxLength": 200},
        },
        "oneOf": [{"required": ["seconds"]}, {"required": ["until"]}],
        "additionalProperties": False,
    },
    wake_time=_after,
)
def check_back_in(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return {"woke": True, "reason": args.get("reason", "")}
