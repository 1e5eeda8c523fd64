"""The shipped timer tool, check_back_in: the run waits with no process and continues later."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pipeline.tools.context import ToolContext
from pipeline.tools.definition import tool

MAX_WAIT = timedelta(days=30)


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
