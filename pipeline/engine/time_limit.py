"""A step's time bound, enforced by the engine in every pool: Celery's time limits hold only in
the prefork pool, and a thread cannot be killed.

The step runs in a thread beside the task's thread (its step runner, kept from step to step)
while the task's thread waits for it. At its first model or tool call past the bound the step
stops itself (StepTimeUp); a step stuck inside a call (a tool that hangs) is given up by the
waiting thread a moment later. Either way the run is taken from it: the fence is bumped (every
later write of the abandoned work is refused), the lease cleared and the step sent again once
that committed; the task returns, so Celery acknowledges its message long before the
visibility timeout and Redis never delivers it again. The next attempt replays what the
journal holds and redoes the rest through the action protocol.
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import psycopg
from sqlalchemy.exc import DBAPIError

import pipeline.statements as statements
from pipeline.app import send_step_after_commit
from pipeline.db import transaction
from pipeline.engine import quarantine
from pipeline.engine.step import StepOutcome, StepResult, execute_step
from pipeline.errors import StepTimeUp, Stuck, redact_urls
from pipeline.logs import get_logger
from pipeline.reachability import DATABASE
from pipeline.runs.failed_attempts import FailureKind
from pipeline.settings import STEP_GIVE_UP_SECONDS, Settings

T = TypeVar("T")
log = get_logger("nightshift.engine")

STUCK_AFTER_SECONDS = 1.0
"""Past the bound, how long a step may take to stop itself before it counts as stuck."""


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
    except StepTimeUp as exc:  # Stuck too
        quarantine.give_up(run_id, owner)
        handed_on = give_up(run_id, owner, settings.lease_seconds)
        what = "stuck in a call" if isinstance(exc, Stuck) else "stopped at a call"
        log.warning(
            "run %s: the step passed its time limit of %gs (%s); %s",
            run_id,
            limit,
            what,
            "handed to another attempt" if handed_on else "nothing left to give up",
        )
        return StepResult(StepOutcome.TIME_UP, run_id)
    except (DBAPIError, psycopg.Error) as exc:  # after the claim (a failed claim is no attempt)
        return _failed_in_database(run_id, owner, settings, exc)


def _failed_in_database(
    run_id: uuid.UUID, owner: str, settings: Settings, exc: Exception
) -> StepResult:
    """A statement of the step failed in PostgreSQL or in a pooler: the attempt is recorded as
    what it was, not as a lost worker (this worker goes on), and the run is handed to the next
    attempt at once, which replays what was journaled. It counts towards max_step_attempts
    unless the error says the server went away. When even that cannot be written (PostgreSQL
    is away), the error goes on to the task: the lease lapses and the tick resumes the run."""
    error = database_error_line(exc)
    counted = not DATABASE.is_outage(exc)
    kind = FailureKind.DATABASE_ERROR
    if not give_up(run_id, owner, settings.lease_seconds, kind, error=error, counted=counted):
        raise exc
    log.warning(
        "run %s: the step failed on a database error (%s); handed to another attempt%s",
        run_id,
        error,
        "" if counted else " (not counted: the server went away)",
    )
    return StepResult(StepOutcome.DATABASE_ERROR, run_id, detail=error)


def database_error_line(exc: BaseException) -> str:
    """The driver's error and its first line (`InvalidSqlStatementName: prepared statement
    "_pg3_7" does not exist`): never SQLAlchemy's wrapper, whose later lines show the statement
    and its parameters (a run's data)."""
    orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = str(orig).strip().splitlines()
    return redact_urls(f"{type(orig).__name__}: {lines[0] if lines else ''}".rstrip(": "))[:300]


def run_bounded(work: Callable[[], T], seconds: float) -> T:
    """`work()` in this thread's step runner: its result or exception, or Stuck after `seconds`
    (the runner is then left to finish the work: it is daemonic and, once fenced out, harmless;
    this thread's next call gets a new runner)."""
    runner = getattr(_runners, "runner", None)
    if runner is None or not runner.is_alive():  # first call, or a fork left it behind
        runner = _runners.runner = _StepRunner(threading.current_thread())
    item = _Work(work, contextvars.copy_context())  # log lines keep their run and step
    runner.inbox.put(item)
    if not item.done.wait(max(0.0, seconds)) and item.abandon():
        _runners.runner = None
        raise Stuck(f"no return within {seconds:.0f}s")
    if not item.returned:
        raise item.value  # type: ignore[misc]
    return item.value  # type: ignore[return-value]


_runners = threading.local()
"""Each calling thread's (a Celery pool thread's) step runner."""


class _Work:
    """One call of `run_bounded`, as the runner sees it."""

    def __init__(self, work: Callable[[], object], context: contextvars.Context) -> None:
        self.work = work
        self.context = context
        self.done = threading.Event()
        self.returned = False
        self.value: object = None
        self._lock = threading.Lock()
        self._abandoned = False

    def run(self) -> bool:
        """Do the work; True when its caller had given up on it meanwhile."""
        try:
            self.value, self.returned = self.context.run(self.work), True
        except BaseException as exc:  # re-raised in the waiting thread, whatever it was
            self.value = exc
        with self._lock:
            self.done.set()
            return self._abandoned

    def abandon(self) -> bool:
        """Give up waiting; False if the work ended just now (its outcome is then used)."""
        with self._lock:
            self._abandoned = not self.done.is_set()
            return self._abandoned


class _StepRunner:
    """A long-lived thread beside one calling thread that runs its steps: starting and ending a
    thread for every step cost a few percent of a short step's CPU. It serves one piece of
    work at a time, and ends once abandoned (its work overran) or once its caller is gone."""

    IDLE_CHECK_SECONDS = 60.0

    def __init__(self, caller: threading.Thread) -> None:
        self.inbox: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._caller = caller
        self._thread = threading.Thread(target=self._serve, name=f"{caller.name}-step", daemon=True)
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _serve(self) -> None:
        while True:
            try:
                item = self.inbox.get(timeout=self.IDLE_CHECK_SECONDS)
            except queue.Empty:
                if self._caller.is_alive():
                    continue
                return  # the pool thread it served has ended: nobody will hand it work
            if item.run():
                log.warning("the abandoned work of an overrun step ended: %r", item.value)
                return
            del item  # an idle runner keeps no step's result (or traceback) alive


def give_up(
    run_id: uuid.UUID,
    owner: str,
    lease_seconds: float,
    kind: FailureKind = FailureKind.TIME_LIMIT,
    *,
    error: str | None = None,
    counted: bool = True,
) -> bool:
    """Take the run from the step `owner` is running (it overran, or failed with `error`) and
    hand it on, the failed attempt recorded as `kind`.

    False when there was nothing to give up: the step finished or parked meanwhile, another
    worker took over, or the database did not answer in time (the lease then lapses: nothing
    renews it, and the tick resends the step).
    """
    # A send in flight holds the run row until its reply, or until PostgreSQL ends its session
    # (one lease at most).
    lock_ms = int((lease_seconds + STEP_GIVE_UP_SECONDS) * 1000)
    try:
        with transaction() as session:
            statements.first(session, "lock_timeout", milliseconds=str(lock_ms))
            # A failed attempt of the step (pipeline/runs/failed_attempts.py): a step that
            # always overruns (or always fails on a database error) ends with that reason once
            # its agent's max_step_attempts are used.
            row = statements.first(
                session, "give_up_step", run_id=run_id, owner=owner, kind=kind, error=error,
                counted=counted,
            )  # fmt: skip
            if row is not None:
                send_step_after_commit(
                    session, run_id, agent=row.agent, step=row.step, batch=row.batch_id
                )
    except Exception as exc:  # the database is away or the lock never came
        if DATABASE.is_outage(exc):
            DATABASE.failed(exc)  # one line an outage, not one a step
        else:
            log.warning(
                "run %s: could not give up the lease (%s); it will lapse",
                run_id, database_error_line(exc),
            )  # fmt: skip
        return False
    return row is not None
