"""Whether this process reaches PostgreSQL and the broker: one warning when one goes away, one
line when it is back, however many ticks, heartbeats, lease renewals and steps fail between.

Every background loop of a worker or beat (the tick, worker heartbeats, the lease renewer,
the webhook senders, a step's claim and its next message, beat's sends) reports here instead
of logging its own failure: an outage of a minute is then two lines in the log, not a
traceback a second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

import kombu.exceptions
import psycopg
import redis.exceptions
from sqlalchemy.exc import DBAPIError, DisconnectionError

from pipeline.errors import DatabaseUnavailable, redact_urls
from pipeline.logs import get_logger

T = TypeVar("T")
log = get_logger("nightshift.reachability")

# SQLSTATE classes of a lost server rather than a failed statement: 08 connection exception,
# 57P operator intervention (shut down, crashed, starting up). A statement timeout (57014) or
# a lock or serialization failure is an OperationalError too, and not an outage.
_OUTAGE_SQLSTATES = ("08", "57P")


def is_database_outage(exc: BaseException) -> bool:
    """True for a failure that says PostgreSQL cannot be reached (or went away meanwhile)."""
    if isinstance(exc, DatabaseUnavailable):  # no claim: unreachable, or no free connection
        return exc.__cause__ is not None and is_database_outage(exc.__cause__)
    if isinstance(exc, DisconnectionError):
        return True
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig if exc.orig is not None else exc
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if isinstance(exc, psycopg.OperationalError):
        return exc.sqlstate is None or exc.sqlstate.startswith(_OUTAGE_SQLSTATES)
    return False


_BROKER_DOWN = (
    kombu.exceptions.OperationalError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    ConnectionError,
)


def is_broker_outage(exc: BaseException) -> bool:
    """True for a failure to reach Redis (kombu wraps redis-py's in its OperationalError)."""
    return isinstance(exc, _BROKER_DOWN)


class Dependency:
    """A service this process needs, and since when it has been unreachable (if it is)."""

    def __init__(self, name: str, is_outage: Callable[[BaseException], bool]) -> None:
        self.name = name
        self.is_outage = is_outage
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._on_outage: list[Callable[[], None]] = []

    def on_outage(self, call: Callable[[], None]) -> None:
        """`call()` whenever an attempt finds it newly unreachable (it must return at once)."""
        self._on_outage.append(call)

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, exc: BaseException) -> None:
        """An attempt found it unreachable: said once per outage."""
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        for call in self._on_outage:
            call()
        since = datetime.now(UTC).strftime("%H:%M:%S UTC")
        log.warning("%s unreachable since %s; retrying (%s)", self.name, since, _reason(exc))

    def reached(self) -> None:
        """An attempt reached it: said once, when it was unreachable before."""
        with self._lock:
            down_since, self._down_since = self._down_since, None
        if down_since is not None:
            log.warning("%s reachable again after %.0f s", self.name, time.monotonic() - down_since)

    def attempt(self, work: Callable[[], T]) -> T | None:
        """work() and its result; None when it found the service away (reported, not raised).
        Any other failure is raised as it was."""
        try:
            result = work()
        except Exception as exc:
            if not self.is_outage(exc):
                raise
            self.failed(exc)
            return None
        self.reached()
        return result


def _reason(exc: BaseException) -> str:
    """The driver's first line, e.g. `connection ... failed: Connection refused`."""
    while isinstance(exc, DBAPIError | DatabaseUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    lines = str(exc).strip().splitlines()
    return redact_urls(lines[0] if lines else type(exc).__name__)


DATABASE = Dependency("database", is_database_outage)
"""PostgreSQL, as this process sees it."""
BROKER = Dependency("broker", is_broker_outage)
"""Redis, as this process sees it."""
