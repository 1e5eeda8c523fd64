"""Worker heartbeats: each worker upserts its row every few seconds from a thread of its own,
so the CLI and the status page can say when no worker takes a queue's steps."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy import Connection, func, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import SQLAlchemyError

from models import WorkerHeartbeat
from pipeline.db import get_engine
from pipeline.logs import get_logger
from pipeline.reachability import DATABASE

log = get_logger("nightshift.workers")


def heartbeat(name: str, queues: Sequence[str]) -> None:
    """Record that the worker `name` is alive and consumes `queues`."""
    now = func.now()
    values = {"queues": list(queues), "hostname": socket.gethostname(), "pid": os.getpid()}
    with _autocommit() as connection:
        connection.execute(
            insert(WorkerHeartbeat)
            .values(name=name, started_at=now, last_seen_at=now, **values)
            .on_conflict_do_update(
                index_elements=["name"],
                set_={"last_seen_at": now, "stopped_at": None, **values},
            )
        )


def stopped(name: str) -> None:
    with _autocommit() as connection:
        named = WorkerHeartbeat.name == name
        connection.execute(update(WorkerHeartbeat).where(named).values(stopped_at=func.now()))


def _autocommit() -> Connection:
    """One statement, committed as it runs: a beat is never a transaction left open between
    round trips. A worker frozen there (SIGSTOP, a paused VM) would hold it idle in
    transaction until PostgreSQL ends the session (idle_in_transaction_session_timeout)."""
    return get_engine().connect().execution_options(isolation_level="AUTOCOMMIT")


class Presence:
    """The heartbeat thread of one worker process; a database outage only delays a beat. Each
    beat also says whether the worker is ready (`Readiness`): PostgreSQL answered it."""

    def __init__(
        self, name: str, queues: Sequence[str], interval: float, readiness: Readiness
    ) -> None:
        self.name, self.queues, self.interval = name, list(queues), interval
        self.readiness = readiness
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="nightshift-presence", daemon=True)

    def start(self) -> Presence:
        # Any of the worker's attempts that finds PostgreSQL away beats at once: the worker is
        # not ready from then, not from its next beat.
        DATABASE.on_outage(self._wake.set)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.readiness.withdraw()
        self._safely(stopped, self.name)

    def _beat(self) -> None:
        while not self._stop.is_set():
            self.readiness.update(self._safely(heartbeat, self.name, self.queues))
            self._wake.wait(self.interval)
            self._wake.clear()

    def _safely(self, write: Callable[..., None], *args: object) -> bool:
        """Whether the write reached PostgreSQL."""

        def written() -> bool:
            write(*args)
            return True

        try:
            return DATABASE.attempt(written) is not None  # an outage is said once, by DATABASE
        except SQLAlchemyError as exc:
            log.warning("worker heartbeat not recorded: %s", type(exc).__name__)
            return False


class Readiness:
    """Whether a worker may take work, for its supervisor and for itself: ready while its
    heartbeats reach PostgreSQL. While ready it keeps `path` fresh (`nightshift ready` reads
    its age) and takes ticks; from the first heartbeat that fails it removes the file and
    `take_ticks(False)` stops it taking ticks, so another worker's tick runs instead of this
    one answering each with nothing done. `celery inspect ping` still answers as Celery does."""

    def __init__(self, path: Path, take_ticks: Callable[[bool], None]) -> None:
        self.path = path
        self.take_ticks = take_ticks
        self._taking = True  # a worker consumes every queue it was started with

    def update(self, reached: bool) -> None:
        if reached:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(f"{os.getpid()}\n")
        else:
            self.path.unlink(missing_ok=True)
        if reached != self._taking:
            try:
                self.take_ticks(reached)
            except Exception as exc:  # the broker is away too: the next beat tries again
                log.warning("could not %s ticks: %s", "resume" if reached else "stop", exc)
                return
            self._taking = reached
            log.warning(
                "ready: taking ticks again" if reached else
                "not ready: PostgreSQL does not answer; taking no ticks until it does"
            )  # fmt: skip

    def withdraw(self) -> None:
        """A worker that stops is not ready."""
        self.path.unlink(missing_ok=True)


def not_ready(path: Path, max_age: float) -> str | None:
    """Why the worker whose ready file is `path` is not ready, or None when it is."""
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return f"not ready: {path} is missing (no worker, or PostgreSQL does not answer it)"
    if age > max_age:
        return (
            f"not ready: {path} was last refreshed {age:.0f} s ago (its worker is stuck, gone, "
            f"or waiting on PostgreSQL; fresh means under {max_age:.0f} s)"
        )
    return None
