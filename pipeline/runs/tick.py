"""The tick: find runs that should be moving and are not, and hand them to a worker.

Runs whose worker died (lease expired), runs left without a message (a crash between the
checkpoint's commit and the enqueue), waiting runs whose timer is due, the probe of a model
provider that is down and, paced, the runs that waited for it; bulk operations whose worker
died; and waiting runs whose deadline
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

from sqlalchemy import Row

import pipeline.statements as statements
from pipeline.app import queued_since, send_step_after_commit
from pipeline.db import transaction
from pipeline.logs import get_logger
from pipeline.reachability import BROKER
from pipeline.runs import bulk, fanout
from pipeline.runs.expiry import expire_abandoned_txn, expire_model_waits_txn, expire_parked_txn
from pipeline.runs.notifications import dispatch_due_txn
from pipeline.runs.outages import tend_outages_txn
from pipeline.runs.waits import wake_due_timers_txn, wake_settled_txn
from pipeline.settings import Settings, get_settings

log = get_logger("nightshift.tick")


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
    notified: list[str] = field(default_factory=list)
    """The keys of the webhooks handed to a worker to send (again)."""
    bulk: list[uuid.UUID] = field(default_factory=list)
    """Bulk operations sent again: their worker died, or their task was lost."""


def tick(settings: Settings | None = None, limit: int = 500) -> TickReport:
    settings = settings or get_settings()
    max_wait = timedelta(days=settings.max_wait_days)
    with transaction() as session:
        grace = settings.handoff_grace_seconds
        queued = _queued_since(settings)
        orphans = statements.rows(
            session, "take_orphans", grace=grace, limit=limit, queued_since=queued,
            lease=settings.lease_seconds,
        )  # fmt: skip
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
        # Last: webhooks the transitions above owe, retries due, senders that died.
        notified = dispatch_due_txn(session, grace, limit)
        lost_bulk = bulk.resend_lost_txn(session, limit)
    if orphans:
        _say_resent(orphans, queued)
    if woken:
        log.info("tick: woke %d run(s) whose timer is due or whose decision was made", len(woken))
    if lost_bulk:
        log.info("tick: re-sent %d bulk operation(s) whose lease passed", len(lost_bulk))
    return TickReport([r.id for r in orphans], woken, expired, notified, lost_bulk)


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
