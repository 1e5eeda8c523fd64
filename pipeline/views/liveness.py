"""Whether anything will move a run: a live worker for its queue (heartbeats), and a claim
within the time the tick allows. Said in words for `nightshift runs`/`show` and the page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import RunStatus, WorkerHeartbeat
from pipeline.db import read_only
from pipeline.settings import Settings, get_settings


@dataclass(frozen=True)
class QueueLiveness:
    queue: str
    alive: list[str]
    """Workers that consume the queue and have sent a heartbeat lately."""
    last_seen: datetime | None
    """The newest heartbeat of any worker that consumes the queue, alive or not."""
    now: datetime

    def no_worker(self) -> str | None:
        """Why nothing will move the queue's runs, or None while a worker consumes it."""
        if self.alive:
            return None
        seen = (
            f"the last one {_ago(self.now - self.last_seen)} ago" if self.last_seen else "none ever"
        )
        return (
            f"no worker has been seen for queue {self.queue!r} ({seen}): nothing moves its runs "
            "until one runs (nightshift worker)"
        )


def queue_liveness(settings: Settings | None = None) -> QueueLiveness:
    settings = settings or get_settings()
    with read_only() as session:
        return queue_liveness_txn(session, settings)


def queue_liveness_txn(session: Session, settings: Settings) -> QueueLiveness:
    stale = timedelta(seconds=3 * settings.worker_heartbeat_seconds)
    now = session.scalar(select(func.now()))
    assert now is not None
    consumes = WorkerHeartbeat.queues.contains([settings.queue])
    rows = session.execute(
        select(WorkerHeartbeat.name, WorkerHeartbeat.last_seen_at, WorkerHeartbeat.stopped_at)
        .where(consumes)
        .order_by(WorkerHeartbeat.last_seen_at.desc())
        .limit(100)
    ).all()
    alive = [r.name for r in rows if r.stopped_at is None and now - r.last_seen_at < stale]
    last_seen = rows[0].last_seen_at if rows else None
    return QueueLiveness(settings.queue, alive, last_seen, now)


def unclaimed_for(settings: Settings) -> timedelta:
    """How long a runnable run may sit with no claim before that means something is wrong:
    the tick re-sends a lost step after the hand-off grace, and runs every tick."""
    return timedelta(seconds=settings.handoff_grace_seconds + 3 * settings.tick_seconds)


def stall(
    status: str,
    lease_owner: str | None,
    updated_at: datetime,
    liveness: QueueLiveness,
    settings: Settings,
) -> str | None:
    """Why this run is not moving, in words; None when nothing says it is stuck."""
    if status != RunStatus.RUNNING:
        return None
    nobody = liveness.no_worker()
    if nobody is not None:
        return nobody
    idle = liveness.now - updated_at
    if lease_owner is None and idle > unclaimed_for(settings):
        return (
            f"runnable for {_ago(idle)} and no worker has claimed it (the tick re-sends a lost "
            f"step after {settings.handoff_grace_seconds:g} s): check that beat runs "
            "(nightshift beat) and how long the queue is (nightshift metrics)"
        )
    return None


def _ago(delta: timedelta) -> str:
    seconds = int(max(delta.total_seconds(), 0))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"
