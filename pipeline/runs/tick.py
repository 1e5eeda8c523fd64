"""The tick: find runs that should be moving and are not, and hand them to a worker.

Runs whose worker died (lease expired), runs left without a message (a crash between the
checkpoint's commit and the enqueue) and waiting runs whose timer is due; and waiting runs
whose deadline passed, which it ends.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from sqlalchemy import text

from pipeline.app import send_step_after_commit
from pipeline.db import transaction
from pipeline.logs import get_logger
from pipeline.runs import fanout
from pipeline.runs.expiry import expire_parked_txn
from pipeline.runs.notify import dispatch_due_txn
from pipeline.runs.waits import wake_due_timers_txn, wake_settled_txn
from pipeline.settings import Settings, get_settings

log = get_logger("nightshift.tick")

# Orphans: running, and either the lease expired or there is none and nothing happened for a
# while (a step hands off by clearing its lease; a message normally claims within the grace).
# Each orphan also opens a `resumptions` row (at most one open per run), recording when the
# run stopped moving; the claim that picks it up closes the row (pipeline/engine/leases.py).
_ORPHANS = text(
    """
    WITH picked AS (
        SELECT id, lease_expires_at, updated_at FROM runs
         WHERE status = 'running'
           AND (lease_expires_at < now()
                OR (lease_expires_at IS NULL
                    AND updated_at < now() - make_interval(secs => :grace)))
         ORDER BY updated_at
         LIMIT :limit
         FOR UPDATE SKIP LOCKED
    ), lost AS (
        INSERT INTO resumptions (run_id, cause, lost_at)
        SELECT id,
               CASE WHEN lease_expires_at IS NULL THEN 'no_message' ELSE 'lease_expired' END,
               coalesce(lease_expires_at, updated_at)
          FROM picked
        ON CONFLICT (run_id) WHERE resumed_at IS NULL DO NOTHING
    )
    UPDATE runs SET lease_expires_at = NULL, lease_owner = NULL, updated_at = now()
      FROM picked WHERE runs.id = picked.id
    RETURNING runs.id, runs.agent, runs.step, runs.batch_id
    """
)


@dataclass(frozen=True)
class TickReport:
    resumed: list[uuid.UUID]
    woken: list[uuid.UUID]
    expired: list[uuid.UUID] = field(default_factory=list)
    """Waiting runs ended because their deadline passed."""
    notified: list[int] = field(default_factory=list)
    """Notifications handed to a worker to send (again)."""


def tick(settings: Settings | None = None, limit: int = 500) -> TickReport:
    settings = settings or get_settings()
    with transaction() as session:
        grace = settings.handoff_grace_seconds
        orphans = session.execute(_ORPHANS, {"grace": grace, "limit": limit}).all()
        # Only after the commit: a step that claims must see the rows as updated here.
        for row in orphans:
            send_step_after_commit(
                session, row.id, agent=row.agent, step=row.step, batch=row.batch_id
            )
        # Before waking timers: a run whose timer and deadline are both due ends.
        expired = expire_parked_txn(session, limit)
        woken = wake_due_timers_txn(session, limit) + wake_settled_txn(session, limit)
        fanout.ready_batches_txn(session)
        # Last: notifications the transitions above owe, retries due, senders that died.
        notified = dispatch_due_txn(session, grace, limit)
    if orphans:
        log.info("tick: resumed %d run(s) with no live worker", len(orphans))
    if woken:
        log.info("tick: woke %d run(s) whose timer is due or whose decision was made", len(woken))
    return TickReport([r.id for r in orphans], woken, expired, notified)
