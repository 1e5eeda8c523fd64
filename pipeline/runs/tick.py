"""The tick: find runs that should be moving and are not, and hand them to a worker.

Runs whose worker died (lease expired), runs left without a message (a crash between the
checkpoint's commit and the enqueue), waiting runs whose timer is due, the probe of a model
provider that is down and, paced, the runs that waited for it; and waiting runs whose deadline
passed, that waited past the maximum wait with no deadline, or past a model outage's horizon,
which it ends.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Row, text

from pipeline.app import queued_since, send_step_after_commit
from pipeline.db import transaction
from pipeline.logs import get_logger
from pipeline.reachability import BROKER
from pipeline.runs import fanout
from pipeline.runs.expiry import expire_abandoned_txn, expire_model_waits_txn, expire_parked_txn
from pipeline.runs.failed_attempts import FailureKind, failed_attempt_sets
from pipeline.runs.notifications import dispatch_due_txn
from pipeline.runs.outages import tend_outages_txn
from pipeline.runs.waits import wake_due_timers_txn, wake_settled_txn
from pipeline.settings import Settings, get_settings

log = get_logger("nightshift.tick")

# Orphans: running, and either the lease expired or there is none and nothing happened for a
# while (a step hands off by clearing its lease; a message normally claims within the grace).
# A run with no lease is re-sent only if it was handed off a grace before the oldest step
# message still queued (:queued_since, that message's own hand-off: pipeline/app.py): the
# queue is first in, first out, so a message sent before that one was taken already; one sent
# after may still wait behind a night's backlog, and re-sending it would only add a duplicate
# to the backlog. "Before" by a grace: updated_at is its transaction's start, and the message
# goes after the commit, so under load two hand-offs reach the queue in the other order.
# Each orphan also opens a `resumptions` row (at most one open per run), recording when the
# run stopped moving; the claim that picks it up closes the row (pipeline/engine/leases.py).
# An expired lease is also a failed attempt of the run's step (pipeline/runs/failed_attempts.py).
_ORPHANS = text(
    """
    WITH picked AS (
        SELECT id, lease_expires_at, updated_at FROM runs
         WHERE status = 'running'
           AND (lease_expires_at < now()
                OR (lease_expires_at IS NULL
                    AND updated_at < now() - make_interval(secs => :grace)
                    AND updated_at < to_timestamp(:queued_since)
                                     - make_interval(secs => :grace)))
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
    UPDATE runs SET lease_expires_at = NULL, lease_owner = NULL, updated_at = now(), {lost}
      FROM picked WHERE runs.id = picked.id
    RETURNING runs.id, runs.agent, runs.step, runs.batch_id,
              picked.lease_expires_at IS NOT NULL AS lapsed
    """.format(
        lost=failed_attempt_sets(
            FailureKind.CRASHED_WORKER,
            worker="runs.lease_owner",
            fence="runs.fence",
            when="picked.lease_expires_at IS NOT NULL",
            lapsed=("picked.lease_expires_at", ":lease"),
        )
    )
)


def _queued_since(settings: Settings) -> float:
    """app.queued_since; -inf (nobody can tell) when the broker is away: then the re-sends
    would fail too, and the next tick tries again."""
    try:
        return queued_since(settings.queue)
    except Exception as exc:
        if not BROKER.is_outage(exc):
            raise
        BROKER.failed(exc)
        return -math.inf


@dataclass(frozen=True)
class TickReport:
    resumed: list[uuid.UUID]
    woken: list[uuid.UUID]
    expired: list[uuid.UUID] = field(default_factory=list)
    """Parked runs ended because their deadline passed or they waited past the maximum wait."""
    notified: list[int] = field(default_factory=list)
    """Notifications handed to a worker to send (again)."""


def tick(settings: Settings | None = None, limit: int = 500) -> TickReport:
    settings = settings or get_settings()
    max_wait = timedelta(days=settings.max_wait_days)
    with transaction() as session:
        grace = settings.handoff_grace_seconds
        queued = _queued_since(settings)
        orphans = session.execute(
            _ORPHANS,
            {
                "grace": grace,
                "limit": limit,
                "queued_since": queued,
                "lease": settings.lease_seconds,
            },
        ).all()
        # Only after the commit: a step that claims must see the rows as updated here.
        for row in orphans:
            send_step_after_commit(
                session, row.id, agent=row.agent, step=row.step, batch=row.batch_id
            )
        # Before waking timers: a run whose timer and deadline are both due ends.
        expired = expire_parked_txn(session, limit) + expire_abandoned_txn(session, max_wait, limit)
        expired += expire_model_waits_txn(session, limit)
        woken = wake_due_timers_txn(session, limit) + wake_settled_txn(session, limit)
        # One probe per model that is down, and the runs that waited it out, a few a tick.
        woken += tend_outages_txn(session, settings)
        fanout.ready_batches_txn(session)
        # Last: notifications the transitions above owe, retries due, senders that died.
        notified = dispatch_due_txn(session, grace, limit)
    if orphans:
        _say_resent(orphans, queued)
    if woken:
        log.info("tick: woke %d run(s) whose timer is due or whose decision was made", len(woken))
    return TickReport([r.id for r in orphans], woken, expired, notified)


def _say_resent(orphans: Sequence[Row[Any]], queued_since: float) -> None:
    """Why the tick sent steps again: lapsed leases (a worker lost), and runs left without a
    message (a crash between a commit and its send), with the queue it judged that by."""
    lapsed = sum(1 for row in orphans if row.lapsed)
    log.info(
        "tick: re-sent %d run(s): %d whose lease expired, %d with no message (%s)",
        len(orphans), lapsed, len(orphans) - lapsed, _backlog(queued_since),
    )  # fmt: skip


def _backlog(queued_since: float) -> str:
    if queued_since == math.inf:
        return "no message queued"
    if queued_since == -math.inf:  # then none was re-sent for a missing message
        return "the oldest queued messages do not say when their runs were handed off"
    when = datetime.fromtimestamp(queued_since, UTC).isoformat(timespec="seconds")
    return f"the oldest queued step was handed off at {when}"
