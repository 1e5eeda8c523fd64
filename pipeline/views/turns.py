"""Runs waiting for their turn (pipeline/engine/gate.py) as people read them: how many wait on
each agent's max_concurrent_runs and each model's rate limits."""

from __future__ import annotations

from sqlalchemy import func, or_, select

from models import Run, RunStatus
from pipeline.db import read_only
from pipeline.keys import Wait, WaitKind


def waiting_for_turns() -> list[str]:
    """One line each for `nightshift runs`, the most waiting first."""
    kinds = [func.split_part(Run.waiting_on, ":", 1) == kind.value
             for kind in (WaitKind.TURN, WaitKind.RATE)]  # fmt: skip
    counted = (
        select(Run.waiting_on, func.count())
        .where(Run.status == RunStatus.WAITING, or_(*kinds))
        .group_by(Run.waiting_on)
        .order_by(func.count().desc())
    )
    with read_only() as session:
        rows = session.execute(counted).all()
    return [_line(Wait.parse(str(waiting_on)), count) for waiting_on, count in rows]


def _line(wait: Wait, count: int) -> str:
    if wait.kind is WaitKind.TURN:
        return f"{count} run(s) wait for their turn: {wait.ref}'s max_concurrent_runs are in a step"
    return f"{count} run(s) wait for their turn under {wait.ref}'s rate limits"
