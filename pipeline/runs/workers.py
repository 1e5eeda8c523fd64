"""Worker heartbeats: each worker upserts its row every few seconds from a thread of its own,
so the CLI and the status page can say when no worker takes a queue's steps."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence

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
    """The heartbeat thread of one worker process; a database outage only delays a beat."""

    def __init__(self, name: str, queues: Sequence[str], interval: float) -> None:
        self.name, self.queues, self.interval = name, list(queues), interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="nightshift-presence", daemon=True)

    def start(self) -> Presence:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._safely(stopped, self.name)

    def _beat(self) -> None:
        while True:
            self._safely(heartbeat, self.name, self.queues)
            if self._stop.wait(self.interval):
                return

    def _safely(self, write: Callable[..., None], *args: object) -> None:
        try:
            DATABASE.attempt(lambda: write(*args))  # an outage is said once, by DATABASE
        except SQLAlchemyError as exc:
            log.warning("worker heartbeat not recorded: %s", type(exc).__name__)
