"""Quarantine: a suspect step (one whose last attempt failed) runs alone among the suspects of
its process, so that when the process dies again the count knows whose step it was.

A threads-pool worker killed by one step takes every step in flight with it. Each of those
runs becomes a suspect (pipeline/runs/failed_attempts.py); their next attempts take this
process's quarantine one at a time, and the one holding it writes its fence to
`runs.quarantine_fence` first. A process that dies while a suspect holds the quarantine counts
that failure against that suspect only; the innocent suspects finish their step in their turn
and are suspects no longer. Runs that are not suspects do not wait.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pipeline.statements as statements
from pipeline.app import send_step_after_commit
from pipeline.db import transaction
from pipeline.engine.leases import Lease, fenced, fenced_first_txn
from pipeline.logs import get_logger
from pipeline.runs.failed_attempts import StepFailures

log = get_logger("nightshift.engine")


class _Quarantine:
    """The process's quarantine: at most one suspect step holds it. Left by that step when it
    ends, or by the time bound when it gives the step up (a hung step keeps its thread, not
    the quarantine)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._holder: Lease | None = None

    def enter(self, lease: Lease, timeout: float) -> bool:
        with self._changed:
            if not self._changed.wait_for(lambda: self._holder is None, max(0.0, timeout)):
                return False
            self._holder = lease
            return True

    def leave(self, holds: Callable[[Lease], bool]) -> None:
        """Free it if `holds` says its holder is the step that ends; else nothing."""
        with self._changed:
            if self._holder is not None and holds(self._holder):
                self._holder = None
                self._changed.notify_all()


_QUARANTINE = _Quarantine()


@contextmanager
def admitted(lease: Lease, step: int, failures: StepFailures, wait: float) -> Iterator[bool]:
    """Run a suspect step in this process's quarantine, any other at once: True once it may
    run (a suspect's quarantine held and its fence recorded, fenced: LeaseLost if the lease is
    gone); False when another suspect held the quarantine all the `wait` seconds (the caller
    hands the step on, with nothing counted)."""
    if not failures.suspect:
        yield True
        return
    if not _QUARANTINE.enter(lease, wait):
        yield False
        return
    try:
        with transaction() as session:
            fenced_first_txn(session, lease, "enter_quarantine")
        log.warning("step %d failed before (%d attempt(s) counted); running it in quarantine",
                    step, failures.count)  # fmt: skip
        yield True
    finally:
        # A step given up at its time bound left already; its next attempt may hold it now.
        _QUARANTINE.leave(lambda held: held == lease)


def give_up(run_id: uuid.UUID, owner: str) -> None:
    """The step of `run_id` under `owner` is given up at its time bound: if it held the
    quarantine, the quarantine goes to the next suspect (the hung call keeps its thread)."""
    _QUARANTINE.leave(lambda held: (held.run_id, held.owner) == (run_id, owner))


def hand_on(lease: Lease, agent: str, step: int, batch_id: str | None) -> None:
    """Give the lease up and send the step again: its turn in quarantine did not come."""
    with fenced(lease) as session:
        statements.execute(session, "release_lease", run_id=lease.run_id, fence=lease.fence)
        send_step_after_commit(session, lease.run_id, agent=agent, step=step, batch=batch_id)
    log.info("the quarantine stayed busy; handed the step on")


def wait_for_turn(ends_by: float | None, default: float) -> float:
    """How long a suspect waits for the quarantine: half of what is left of its time bound,
    so that the step still has time once admitted."""
    if ends_by is None:
        return default
    return max(0.0, (ends_by - time.monotonic()) / 2)


def _fresh_after_fork() -> None:
    # A forked pool child starts with the quarantine free, whatever the parent held.
    global _QUARANTINE
    _QUARANTINE = _Quarantine()


os.register_at_fork(after_in_child=_fresh_after_fork)
