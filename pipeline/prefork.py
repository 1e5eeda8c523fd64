"""A prefork pool child that dies is reaped at once, so its step is re-sent at once, instead of
up to 5 s later (Celery 5.7's AsynPool, kernel timing).

A prefork worker learns that a pool child exited when the child's sentinel pipe becomes
readable, and then reaps it (`waitpid(WNOHANG)`, in `maintain_pool`) and fails its task with
WorkerLostError, which is what re-sends a step (`task_retry_on_worker_lost`). The kernel
closes a dying process's files (the sentinel with them) a moment before the process can be
reaped, so the reap often comes too early and finds nothing (in half of the pool-child kills
of bench/time_to_resume.py). The worker has stopped watching the sentinel by then, and nothing
looks again until the pool's maintenance timer, every 5 s. Here, while a child whose sentinel
fired is not reaped, the pool looks again after a few milliseconds, then less and less often.
"""

from __future__ import annotations

from typing import Any

RECHECK_AFTER = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
"""Seconds between looks at a child that is not reaped yet (about 4 s in all: after that, a
child that closed its sentinel but lives on is left to the pool's own 5 s timer)."""

_MARK = "_nightshift_reaps_promptly"


def reap_dead_children_promptly() -> None:
    """Patch Celery's AsynPool once (a worker's pool is created after worker_init); calling it
    again does nothing. Nothing changes for a child that was reaped at the first look."""
    from celery.concurrency.asynpool import AsynPool  # a worker's import, not every process's

    original = AsynPool._event_process_exit
    if getattr(original, _MARK, False):
        return

    def _event_process_exit(self: AsynPool, hub: Any, proc: Any) -> None:
        original(self, hub, proc)
        _look_again(self, hub, proc, 0)

    setattr(_event_process_exit, _MARK, True)
    AsynPool._event_process_exit = _event_process_exit


def _look_again(pool: Any, hub: Any, proc: Any, looks: int) -> None:
    if proc in pool._pool and looks < len(RECHECK_AFTER):  # not reaped yet
        hub.call_later(RECHECK_AFTER[looks], _reap, pool, hub, proc, looks + 1)


def _reap(pool: Any, hub: Any, proc: Any, looks: int) -> None:
    if proc in pool._pool:
        pool.maintain_pool()  # reaps every exited child, fails its task, starts a new child
        _look_again(pool, hub, proc, looks)
