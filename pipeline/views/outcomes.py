"""A run's outcome, and waiting for it with no worker held.

Waiting listens on the PostgreSQL channel `nightshift_run_settled`, which the run status
trigger (the run_events migration) notifies when a run finishes or starts waiting; every RECHECK
seconds it looks again anyway, so a lost notification (a reconnect) only costs latency. A
waiter costs one query when it starts, one per notification for its run and one per RECHECK.

LISTEN needs PostgreSQL's own session, which a transaction pooler does not give (it hands each
transaction to another server connection, and a notification to a pooled server connection
reaches nobody): it takes NIGHTSHIFT_DATABASE_DIRECT_URL when that is set, and behind a pooler
a waiter only looks.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import select

from models import Run, RunStatus
from pipeline.db import BACKEND_PID, database_url, is_pooled, read_only
from pipeline.errors import RunNotFound
from pipeline.keys import Wait, WaitKind
from pipeline.logs import get_logger
from pipeline.settings import Settings, get_settings, postgres_urls

SETTLED_CHANNEL = "nightshift_run_settled"
RECHECK = 5.0
"""Seconds between looks at the run when no notification came."""

_PERSON = frozenset({WaitKind.APPROVAL, WaitKind.ACTION, WaitKind.VERSION, WaitKind.CLAIMED})
log = get_logger("nightshift.db")

THROUGH_POOLER = (
    "live waits: {variable} goes through a connection pooler, where LISTEN hears nothing; "
    "waits look at their run every {seconds:g} s instead. Set NIGHTSHIFT_DATABASE_DIRECT_URL "
    "to PostgreSQL's own address"
)
_said = threading.Event()


def listen_conninfo(settings: Settings | None = None) -> str:
    """libpq's connection string for a LISTEN: the direct URL, else the database URL."""
    settings = settings or get_settings()
    return postgres_urls.conninfo(settings.database_direct_url or database_url(settings))


def can_listen(reported_pid: int, session_pid: int | None) -> bool:
    """Whether the LISTEN connection whose startup reported `reported_pid` and whose statement
    ran in `session_pid` (pipeline.db.BACKEND_PID) reaches PostgreSQL's own session. Behind a
    pooler it does not: said once a process, in one line, naming the variable to set."""
    if not is_pooled(reported_pid, session_pid):
        return True
    if not _said.is_set():
        _said.set()
        direct = get_settings().database_direct_url is not None
        variable = "NIGHTSHIFT_DATABASE_DIRECT_URL" if direct else "NIGHTSHIFT_DATABASE_URL"
        log.warning(THROUGH_POOLER.format(variable=variable, seconds=RECHECK))
    return False


@dataclass(frozen=True)
class RunOutcome:
    run_id: uuid.UUID
    status: RunStatus
    stop_reason: str | None
    waiting_on: str | None
    wake_at: datetime | None
    result: dict[str, Any] | None
    error: str | None
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        return self.status.is_terminal()

    @property
    def succeeded(self) -> bool:
        return self.status is RunStatus.SUCCEEDED

    @property
    def settled(self) -> bool:
        """Finished, or waiting (a timer, an approval, a person): nothing is running."""
        return self.status.is_terminal() or self.status.is_parked()

    @property
    def needs_person(self) -> bool:
        """Nothing moves until a person decides (an approval) or says what happened."""
        if self.status is RunStatus.NEEDS_ATTENTION:
            return True
        return self.waiting_on is not None and Wait.parse(self.waiting_on).kind in _PERSON

    def done(self, through_timers: bool) -> bool:
        """Whether a caller waiting for this run can stop: it settled, and (through_timers)
        a timer or a retry will not move it on by itself."""
        if not through_timers:
            return self.settled
        return self.status.is_terminal() or (self.status.is_parked() and self.needs_person)

    @classmethod
    def from_json(cls, run: dict[str, Any]) -> RunOutcome:
        """The inverse of as_json; also reads a run as the API shows it (`id`, no
        `finished_at` needed), which is how pipeline.api.client gets one."""
        return cls(
            run_id=uuid.UUID(str(run.get("run_id") or run["id"])),
            status=RunStatus(run["status"]),
            stop_reason=run.get("stop_reason"),
            waiting_on=run.get("waiting_on"),
            wake_at=_time(run.get("wake_at")),
            result=run.get("result"),
            error=run.get("error"),
            finished_at=_time(run.get("finished_at")),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": str(self.run_id),
            "status": self.status.value,
            "stop_reason": self.stop_reason,
            "waiting_on": self.waiting_on,
            "wake_at": self.wake_at.isoformat() if self.wake_at else None,
            "result": self.result,
            "error": self.error,
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
        }


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def outcome(run_id: uuid.UUID) -> RunOutcome:
    with read_only() as session:
        row = session.execute(
            select(
                Run.status,
                Run.stop_reason,
                Run.waiting_on,
                Run.wake_at,
                Run.result,
                Run.error,
                Run.finished_at,
            ).where(Run.id == run_id)
        ).one_or_none()
    if row is None:
        raise RunNotFound(f"no run has id {run_id}")
    return RunOutcome(run_id, *row)


def wait_for_outcome(
    run_id: uuid.UUID, timeout: float, *, through_timers: bool = False
) -> RunOutcome:
    """The run once it settled (or, through_timers, once only a person could move it on), or
    as it is when `timeout` seconds have passed. For processes that reach the database (the
    CLI, scripts); other services use the API's `?wait=` (pipeline.api.client.wait_for_run)."""
    give_up = time.monotonic() + timeout
    with psycopg.connect(listen_conninfo(), autocommit=True) as listener:
        session = listener.execute(BACKEND_PID).fetchone()
        hears = can_listen(listener.info.backend_pid, session[0] if session else None)
        if hears:
            listener.execute(f"LISTEN {SETTLED_CHANNEL}")  # before looking: no change slips by
        while True:
            found = outcome(run_id)
            left = give_up - time.monotonic()
            if found.done(through_timers) or left <= 0:
                return found
            if not hears:
                time.sleep(min(RECHECK, left))
                continue
            for note in listener.notifies(timeout=min(RECHECK, left)):
                if note.payload == str(run_id):
                    break
