"""A step's time bound, enforced by the engine in every pool: Celery's time limits hold only in
the prefork pool, and a thread cannot be killed.

The step runs in a thread of its own while the task's thread waits for it. At its first model
or tool call past the bound the step stops itself (StepTimeUp); a step stuck inside a call (a
tool that hangs) is given up by the waiting thread a moment later. Either way the run is taken
from it: the fence is bumped (every later write of the abandoned work is refused), the lease
cleared and the step sent again once that committed; the task returns, so Celery acknowledges
its message long before the visibility timeout and Redis never delivers it again. The next
attempt replays what the journal holds and redoes the rest through the action protocol.
"""

from __future__ import annotations

import contextvars
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import text

from pipeline.app import send_step_after_commit
from pipeline.db import transaction
from pipeline.engine.step import Outcome, StepResult, execute_step
from pipeline.errors import StepTimeUp
from pipeline.logs import get_logger
from pipeline.settings import STEP_GIVE_UP_SECONDS, Settings

T = TypeVar("T")
log = get_logger("nightshift.engine")

STUCK_AFTER_SECONDS = 1.0
"""Past the bound, how long a step may take to stop itself before it counts as stuck."""

_GIVE_UP = text(
    """
    UPDATE runs
       SET fence = fence + 1, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
     WHERE id = :run_id AND lease_owner = :owner AND status = 'running'
    RETURNING agent, step, batch_id
    """
)


class Stuck(Exception):
    """The work did not return in time."""


def execute_bounded_step(
    run_id: uuid.UUID, owner: str, settings: Settings, *, leave_unknown_agent: bool = False
) -> StepResult:
    """`execute_step`, ending within the step time limit whatever the agent's tools do."""
    limit = settings.step_time_limit
    ends_by = time.monotonic() + limit
    try:
        return run_bounded(
            lambda: execute_step(
                run_id, owner, settings, leave_unknown_agent=leave_unknown_agent, ends_by=ends_by
            ),
            limit + STUCK_AFTER_SECONDS,
        )
    except (StepTimeUp, Stuck) as exc:
        handed_on = give_up(run_id, owner, settings.lease_seconds)
        what = "stuck in a call" if isinstance(exc, Stuck) else "stopped at a call"
        log.warning(
            "run %s: the step passed its time limit of %gs (%s); %s",
            run_id,
            limit,
            what,
            "handed to another attempt" if handed_on else "nothing left to give up",
        )
        return StepResult(Outcome.TIME_UP, run_id)


def run_bounded(work: Callable[[], T], seconds: float) -> T:
    """`work()` in a thread of its own: its result or exception, or Stuck after `seconds`
    (the thread is then left to run: it is daemonic and, once fenced out, harmless)."""
    outcome: list[tuple[bool, object]] = []
    abandoned = threading.Event()
    context = contextvars.copy_context()  # log lines keep their run and step

    def target() -> None:
        try:
            outcome.append((True, context.run(work)))
        except BaseException as exc:  # re-raised in the waiting thread, whatever it was
            outcome.append((False, exc))
        if abandoned.is_set():
            log.warning("the abandoned work of an overrun step ended: %r", outcome[0][1])

    worker = threading.Thread(target=target, name=f"{threading.current_thread().name}-step")
    worker.daemon = True
    worker.start()
    worker.join(max(0.0, seconds))
    if not outcome:
        abandoned.set()
        raise Stuck(f"no return within {seconds:.0f}s")
    returned, value = outcome[0]
    if not returned:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]


def give_up(run_id: uuid.UUID, owner: str, lease_seconds: float) -> bool:
    """Take the run from the overrunning step `owner` is running and hand it on.

    False when there was nothing to give up: the step finished or parked meanwhile, another
    worker took over, or the database did not answer in time (the lease then lapses: nothing
    renews it, and the tick resends the step).
    """
    # A send in flight holds the run row until its reply, or until PostgreSQL ends its session
    # (one lease at most).
    lock_ms = int((lease_seconds + STEP_GIVE_UP_SECONDS) * 1000)
    try:
        with transaction() as session:
            session.execute(text(f"SET LOCAL lock_timeout = {lock_ms}"))
            row = session.execute(_GIVE_UP, {"run_id": run_id, "owner": owner}).one_or_none()
            if row is not None:
                send_step_after_commit(
                    session, run_id, agent=row.agent, step=row.step, batch=row.batch_id
                )
    except Exception as exc:  # the database is away or the lock never came
        log.warning("run %s: could not give up the lease (%s); it will lapse", run_id, exc)
        return False
    return row is not None
