"""Durable timers: a run that must check back later is parked with a wake-up time, holding no
worker and no broker message; the tick wakes it. Never a long Celery countdown. The tool an
agent calls is `pipeline.check_back_in` (pipeline/tools/timer.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from models import RunStatus
from pipeline.engine import journal as jr
from pipeline.engine.actions import ParkRun
from pipeline.engine.leases import Lease, fenced
from pipeline.keys import timer_key, timer_wait
from pipeline.tools import Tool


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
        raise ParkRun(RunStatus.WAITING, timer_wait(block["id"]), wake_at=wake_at)
