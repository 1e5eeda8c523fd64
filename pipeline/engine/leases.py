"""Leases with fencing tokens: claim a run, renew it, and refuse every write from a stale holder."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Executable, Row, text
from sqlalchemy.orm import Session

import pipeline.instruments as instruments
from pipeline.db import after_commit, transaction
from pipeline.engine.holders import is_certainly_gone
from pipeline.errors import LeaseLost
from pipeline.logs import get_logger

log = get_logger("nightshift.leases")


@dataclass(frozen=True)
class Lease:
    """Proof of holding a run: writes carrying this fence succeed only while it is current."""

    run_id: uuid.UUID
    fence: int
    owner: str


RELEASED = {"lease_owner": None, "lease_expires_at": None}
"""Giving up the lease, in the same UPDATE that checkpoints, parks or finishes the run: the
next step's message may claim at once."""

_CLAIM = text(
    """
    WITH prior AS (
        SELECT id, lease_expires_at FROM runs
         WHERE id = :run_id
           AND status = 'running'
           AND (lease_expires_at IS NULL OR lease_expires_at < now())
           FOR UPDATE
    )
    UPDATE runs
       SET fence = fence + 1,
           lease_owner = :owner,
           lease_expires_at = now() + make_interval(secs => :lease),
           attempt = attempt + 1,
           updated_at = now()
      FROM prior
     WHERE runs.id = prior.id
    RETURNING runs.fence, prior.lease_expires_at AS expired_at
    """
)

# A claim that takes a run over closes its open `resumptions` row (opened by the tick), or
# records one itself when it found the lease expired with no tick in between. A statement of
# its own, so that it sees a row the tick committed while this claim waited for the run lock.
_RECORD_TAKEOVER = text(
    """
    WITH resumed AS (
        UPDATE resumptions SET resumed_at = now(), fence = :fence
         WHERE run_id = :run_id AND resumed_at IS NULL
        RETURNING cause, extract(epoch FROM resumed_at - lost_at) AS seconds
    ), recorded AS (
        INSERT INTO resumptions (run_id, cause, lost_at, resumed_at, fence)
        SELECT :run_id, 'lease_expired', CAST(:expired_at AS timestamptz), now(), :fence
         WHERE CAST(:expired_at AS timestamptz) IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM resumed)
        RETURNING cause, extract(epoch FROM resumed_at - lost_at) AS seconds
    )
    SELECT cause, seconds FROM resumed UNION ALL SELECT cause, seconds FROM recorded
    """
)

_RENEW = text(
    """
    UPDATE runs
       SET lease_expires_at = now() + make_interval(secs => :lease)
     WHERE id = :run_id AND fence = :fence AND status = 'running' AND lease_owner = :owner
    """
)

_GUARD = text("UPDATE runs SET updated_at = now() WHERE id = :run_id AND fence = :fence")


def claim_txn(
    session: Session, run_id: uuid.UUID, owner: str, lease_seconds: float
) -> Lease | None:
    """Take the run if it is runnable and nobody holds a live lease; None otherwise."""
    claimed = session.execute(
        _CLAIM, {"run_id": run_id, "owner": owner, "lease": lease_seconds}
    ).one_or_none()
    if claimed is None:
        return None
    takeover = session.execute(
        _RECORD_TAKEOVER,
        {"run_id": run_id, "fence": claimed.fence, "expired_at": claimed.expired_at},
    ).one_or_none()
    if takeover is not None:
        cause, seconds = takeover.cause, float(takeover.seconds)
        after_commit(session, lambda: instruments.resumed(cause, seconds))
    return Lease(run_id, claimed.fence, owner)


_CLAIM_FROM_DEAD = text(
    """
    UPDATE runs
       SET fence = fence + 1,
           lease_owner = :owner,
           lease_expires_at = now() + make_interval(secs => :lease),
           attempt = attempt + 1,
           updated_at = now()
     WHERE id = :run_id AND status = 'running' AND lease_owner = :dead
    RETURNING fence
    """
)


def claim_from_dead_txn(
    session: Session, run_id: uuid.UUID, owner: str, lease_seconds: float
) -> Lease | None:
    """Take over at once from a holder that is certainly gone (a pool child that died, a
    process whose pid this worker can check: pipeline/engine/holders.py), instead of waiting
    for its lease to lapse. The fence still refuses it should it somehow write again."""
    holder = session.scalar(text("SELECT lease_owner FROM runs WHERE id = :id"), {"id": run_id})
    if holder is None or not is_certainly_gone(holder):
        return None
    fence = session.execute(
        _CLAIM_FROM_DEAD,
        {"run_id": run_id, "owner": owner, "lease": lease_seconds, "dead": holder},
    ).scalar_one_or_none()
    if fence is None:
        return None
    log.warning("run %s: took over from %s, a process that is gone", run_id, holder)
    return Lease(run_id, fence, owner)


def claim(run_id: uuid.UUID, owner: str, lease_seconds: float) -> Lease | None:
    with transaction() as session:
        return claim_txn(session, run_id, owner, lease_seconds)


def renew(lease: Lease, lease_seconds: float) -> bool:
    """Extend the lease; False means another worker has taken the run over."""
    with transaction() as session:
        result = session.execute(
            _RENEW,
            {
                "run_id": lease.run_id,
                "fence": lease.fence,
                "owner": lease.owner,
                "lease": lease_seconds,
            },
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def guard_txn(session: Session, lease: Lease) -> None:
    """First statement of every fenced transaction: locks the run row and checks the fence."""
    result = session.execute(_GUARD, {"run_id": lease.run_id, "fence": lease.fence})
    if not result.rowcount:  # type: ignore[attr-defined]
        raise LeaseLost(f"run {lease.run_id}: fence {lease.fence} is no longer current")


def fenced_first_txn(
    session: Session, lease: Lease, statement: Executable, values: dict[str, Any]
) -> Row[Any]:
    """The fence check inside the write itself, as the first statement of a transaction:
    `statement` updates the run's row `WHERE id = :run_id AND fence = :fence` (locking it, as
    guard_txn's UPDATE does), directly or in a CTE, and returns a row; none raises LeaseLost
    and the transaction rolls back. One round trip where guard_txn and the write take two."""
    row = session.execute(
        statement, {**values, "run_id": lease.run_id, "fence": lease.fence}
    ).first()
    if row is None:
        raise LeaseLost(f"run {lease.run_id}: fence {lease.fence} is no longer current")
    return row


@contextmanager
def fenced(lease: Lease) -> Iterator[Session]:
    """A transaction that commits only if `lease` is still the run's current fence."""
    with transaction() as session:
        guard_txn(session, lease)
        yield session


class Heartbeat:
    """Renews a lease every `interval` seconds in a background thread while a step works.

    The step calls `check()` before each model call, tool call and write: once a renewal has
    matched no row, the lease is gone and the step must stop before writing anything.
    """

    def __init__(self, lease: Lease, lease_seconds: float, interval: float) -> None:
        self.lease = lease
        self._lease_seconds = lease_seconds
        self._interval = interval
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{lease.run_id}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval + 5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                if not renew(self.lease, self._lease_seconds):
                    self._lost.set()
                    return
            except Exception:  # the database is briefly away: keep trying until the lease lapses
                log.warning("run %s: lease renewal failed, will retry", self.lease.run_id)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def check(self) -> None:
        if self._lost.is_set():
            raise LeaseLost(f"run {self.lease.run_id}: lease lost (fence {self.lease.fence})")
