"""Leases with fencing tokens: claim a run, renew it, and refuse every write from a stale holder."""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

import pipeline.instruments as instruments
import pipeline.statements as statements
from pipeline.db import transaction
from pipeline.engine import step_sql
from pipeline.engine.holders import is_certainly_gone
from pipeline.errors import LeaseLost
from pipeline.logs import get_logger
from pipeline.reachability import DATABASE
from pipeline.settings import Settings

log = get_logger("nightshift.leases")


@dataclass(frozen=True)
class Lease:
    """Proof of holding a run: writes carrying this fence succeed only while it is current."""

    run_id: uuid.UUID
    fence: int
    owner: str


def take(
    run_id: uuid.UUID,
    owner: str,
    lease_seconds: float,
    settings: Settings,
    last_entry: int = 0,
) -> step_sql.Claimed | None:
    """Claim the run for a step and load it (step_sql.claim, one round trip); None if it is
    not runnable or another worker holds a live lease. A holder that is certainly gone (a
    pool child that died, a process whose pid this worker can check: holders.py) is taken
    over at once instead of waiting for its lease to lapse; the fence still refuses it should
    it somehow write again."""
    claimed = step_sql.claim(run_id, owner, lease_seconds, last_entry, settings)
    if isinstance(claimed, step_sql.NotClaimed):
        holder = claimed.holder
        if holder is None or not is_certainly_gone(holder):
            return None
        claimed = step_sql.claim(run_id, owner, lease_seconds, last_entry, settings, dead=holder)
        if isinstance(claimed, step_sql.NotClaimed):
            return None
        log.warning("run %s: took over from %s, a process that is gone", run_id, holder)
    if claimed.resumed is not None:
        instruments.resumed(*claimed.resumed)
    return claimed


def renew_held(leases: Mapping[Lease, float]) -> tuple[set[Lease], set[Lease]]:
    """Extend each lease by its lease seconds, in one statement: (renewed, busy).

    Busy leases are still their holder's but their run's row was locked by another transaction
    (a send in flight, a write): not renewed this time. Every other lease is lost: taken over,
    handed off or finished.
    """
    if not leases:
        return set(), set()
    by_key = {(lease.run_id, lease.fence): lease for lease in leases}
    rows = step_sql.renew_leases(
        [lease.run_id for lease in leases],
        [lease.fence for lease in leases],
        [lease.owner for lease in leases],
        list(leases.values()),
    )
    renewed = {by_key[(row.id, row.fence)] for row in rows if row.renewed}
    busy = {by_key[(row.id, row.fence)] for row in rows if not row.renewed}
    return renewed, busy


def guard_txn(session: Session, lease: Lease) -> None:
    """First statement of every fenced transaction: locks the run row and checks the fence."""
    if not statements.execute(session, "fence_guard", run_id=lease.run_id, fence=lease.fence):
        raise LeaseLost(f"run {lease.run_id}: fence {lease.fence} is no longer current")


def fenced_first_txn(session: Session, lease: Lease, name: str, **params: Any) -> Row[Any]:
    """The fence check inside the write itself, as the first statement of a transaction: the
    named statement updates the run's row `WHERE id = %(run_id)s AND fence = %(fence)s`
    (locking it, as guard_txn's UPDATE does), directly or in a CTE, and returns a row; none
    raises LeaseLost and the transaction rolls back. One round trip where guard_txn and the
    write take two."""
    row = statements.first(session, name, run_id=lease.run_id, fence=lease.fence, **params)
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
    """Keeps a lease renewed while a step works: entering hands it to this process's renewer,
    leaving takes it back.

    The step calls `check()` before each model call, tool call and write: once a renewal has
    matched no row, the lease is gone and the step must stop before writing anything.
    """

    def __init__(self, lease: Lease, lease_seconds: float, interval: float) -> None:
        self.lease = lease
        self.lease_seconds = lease_seconds
        self.interval = interval
        self._lost = threading.Event()
        self._renewer: _Renewer | None = None

    def __enter__(self) -> Heartbeat:
        self._renewer = _process_renewer()
        self._renewer.hold(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._renewer is not None:
            self._renewer.release(self)

    def _mark_lost(self) -> None:  # by the renewer
        self._lost.set()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def check(self) -> None:
        if self._lost.is_set():
            raise LeaseLost(f"run {self.lease.run_id}: lease lost (fence {self.lease.fence})")


SLOTS_PER_INTERVAL = 4
"""Renewals fall on a grid of a quarter interval: the leases that come due within the same
quarter are renewed by one statement, never early and at most a quarter interval late (a
process's leases then take at most four statements an interval, however many there are)."""


def _slot(at: float, interval: float) -> float:
    """The first grid point at or after `at` (time.monotonic())."""
    step = interval / SLOTS_PER_INTERVAL
    return math.ceil(at / step - 1e-9) * step


class _Renewer:
    """One thread a process renewing every lease its steps hold: a thread and a transaction per
    step cost more CPU than the step's own work when steps are short and many run at once.

    A lease is first renewed one interval after it was handed over, then every interval; a
    database error is logged and the renewal retried an interval later (the lease lapses if
    none succeeds); a renewal that finds the lease gone marks its heartbeat lost.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._changed = threading.Condition()
        self._due: dict[Heartbeat, float] = {}
        """Each held heartbeat, and when its next renewal is due (time.monotonic())."""
        self._wakes_at = math.inf
        """When the thread next wakes by itself; -inf while it is renewing (it looks again)."""
        self._thread: threading.Thread | None = None

    def hold(self, heartbeat: Heartbeat) -> None:
        due = _slot(time.monotonic() + heartbeat.interval, heartbeat.interval)
        with self._changed:
            self._due[heartbeat] = due
            if self._thread is None or not self._thread.is_alive():  # first use, or it died
                self._thread = threading.Thread(
                    target=self._serve, name="lease-renewer", daemon=True
                )
                self._thread.start()
            elif due < self._wakes_at:  # else it wakes in time anyway: no wake-up per step
                self._changed.notify()

    def release(self, heartbeat: Heartbeat) -> None:
        # The thread is not woken: at its next wake it finds one lease fewer.
        with self._changed:
            self._due.pop(heartbeat, None)

    def _serve(self) -> None:
        while True:
            due = self._wait_for_due()
            self._settle(due, self._renew(due))

    def _wait_for_due(self) -> list[Heartbeat]:
        with self._changed:
            while True:
                now = time.monotonic()
                due = [heartbeat for heartbeat, at in self._due.items() if at <= now]
                if due:
                    self._wakes_at = -math.inf
                    return due
                self._wakes_at = min(self._due.values(), default=math.inf)
                self._changed.wait(None if self._wakes_at == math.inf else self._wakes_at - now)

    def _renew(self, due: list[Heartbeat]) -> tuple[set[Lease], set[Lease]] | None:
        leases: dict[Lease, float] = {}
        for heartbeat in due:
            leases[heartbeat.lease] = max(leases.get(heartbeat.lease, 0), heartbeat.lease_seconds)
        try:
            # Each try renews only the leases still held: DATABASE retries through an outage,
            # and a step that gave up meanwhile (its write failed on the outage) must not get
            # a lease for a lease more after the database came back.
            renewed = DATABASE.attempt(lambda: renew_held(self._still_held(leases)))
        except Exception as exc:  # keep trying until the leases lapse
            runs = ", ".join(str(lease.run_id) for lease in leases)
            log.warning("lease renewal failed, will retry (runs %s): %s", runs, exc)
            return None
        # None: the database is away (DATABASE says so once); keep trying until leases lapse
        return renewed

    def _still_held(self, leases: dict[Lease, float]) -> dict[Lease, float]:
        with self._changed:
            held = {heartbeat.lease for heartbeat in self._due}
        return {lease: seconds for lease, seconds in leases.items() if lease in held}

    def _settle(self, due: list[Heartbeat], outcome: tuple[set[Lease], set[Lease]] | None) -> None:
        now = time.monotonic()
        with self._changed:
            for heartbeat in due:
                at = self._due.get(heartbeat)
                if at is None:  # its step ended meanwhile
                    continue
                interval = heartbeat.interval
                if outcome is None or heartbeat.lease in outcome[0]:
                    self._due[heartbeat] = _slot(max(at + interval, now), interval)
                elif heartbeat.lease in outcome[1]:  # its row was locked: try again soon
                    self._due[heartbeat] = _slot(
                        max(at + interval / SLOTS_PER_INTERVAL, now), interval
                    )
                else:
                    heartbeat._mark_lost()
                    del self._due[heartbeat]


_renewer: _Renewer | None = None
_renewer_lock = threading.Lock()


def _process_renewer() -> _Renewer:
    """This process's renewer. A forked child (a prefork pool child) makes its own: the
    parent's thread does not run in it, and the parent's leases are not the child's."""
    global _renewer
    with _renewer_lock:
        if _renewer is None or _renewer.pid != os.getpid():
            _renewer = _Renewer()
        return _renewer


def _fresh_lock_after_fork() -> None:
    # Another thread may have held the lock when the process forked: it would stay held.
    global _renewer_lock
    _renewer_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)
