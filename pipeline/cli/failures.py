"""What goes wrong before a command gets to do its work, in one line each: the database or the
broker cannot be reached, the schema is missing; and the embedded services a short command
started on its own, stopped again when it ends."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import kombu.exceptions
import psycopg.errors
import redis.exceptions
from sqlalchemy.exc import DBAPIError

import pipeline.embedded as embedded
from pipeline.db import dispose_all, started_here
from pipeline.errors import Unavailable
from pipeline.reachability import is_database_outage
from pipeline.settings import Settings, broker_urls, get_settings, postgres_urls

LONG_RUNNING = frozenset({"services", "worker", "beat", "flower", "api", "demo", "chaos"})
"""Commands that keep (or hand on) the embedded services they start; every other command
stops the ones it found stopped and started itself."""

_NO_SCHEMA = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn)
_BROKER_DOWN = (kombu.exceptions.OperationalError, redis.exceptions.ConnectionError)


def describe(exc: BaseException) -> str | None:
    """One line for a database or broker failure (never the password); None for others."""
    settings = get_settings()
    if isinstance(exc, DBAPIError) and isinstance(exc.orig, _NO_SCHEMA):
        # A missing column is a schema older than this release, not a missing schema.
        what = (
            "has no nightshift tables yet"
            if isinstance(exc.orig, psycopg.errors.UndefinedTable)
            else "has a schema older than this nightshift"
        )
        if settings.database_url is None:
            return (
                f"{_database(settings)} {what}: run "
                "`nightshift services up` and `nightshift migrate`"
            )
        return f"{_database(settings)} {what}: run `nightshift migrate`"
    if isinstance(exc, DBAPIError) and isinstance(exc.orig, psycopg.Error):
        exc = exc.orig
    if isinstance(exc, psycopg.OperationalError) or is_database_outage(exc):
        return (
            f"cannot reach {_database(settings)}: {_reason(exc, settings)} "
            f"({_bring_back_database(settings)})"
        )
    if isinstance(exc, _BROKER_DOWN):
        return (
            f"cannot reach {_broker(settings)}: {_reason(exc, settings)} (a run already saved "
            "is sent again by beat's tick once the broker is back)"
        )
    return None


def _database(settings: Settings) -> str:
    if settings.database_url is None:
        return f"the embedded PostgreSQL in {settings.data_dir}"
    return f"the database at {postgres_urls.where(settings.database_url)} (NIGHTSHIFT_DATABASE_URL)"


def _bring_back_database(settings: Settings) -> str:
    if settings.database_url is None:
        return "`nightshift services up` starts it again"
    return "is PostgreSQL running there? check NIGHTSHIFT_DATABASE_URL"


@contextmanager
def following(scope: str, ident: object) -> Iterator[None]:
    """A client that follows a run (or batch) that has started and loses the database or the
    broker: one line saying so, that the run carries on without it, and how to bring the
    service back and follow the run again."""
    try:
        yield
    except Exception as exc:
        line = describe(exc)
        if line is None:
            raise
        raise Unavailable(
            f"{line}; {scope} {ident} carries on without this command once it is back: "
            f"nightshift watch {ident}"
        ) from None


def _broker(settings: Settings) -> str:
    if settings.broker_url is None:
        return f"the embedded Redis in {settings.data_dir}"
    if broker_urls.is_sentinel(settings.broker_url):
        return (
            f"the broker {settings.broker_sentinel_master!r} through the sentinels at "
            f"{broker_urls.sentinels_of(settings.broker_url)} (NIGHTSHIFT_BROKER_URL)"
        )
    parts = urlsplit(settings.broker_url)
    return f"the broker at {_host(parts.hostname, parts.port)} (NIGHTSHIFT_BROKER_URL)"


def _host(hostname: str | None, port: int | None) -> str:
    return f"{hostname or 'localhost'}:{port}" if port else hostname or "localhost"


def _reason(exc: BaseException, settings: Settings) -> str:
    """The driver's own reason, e.g. "Connection refused", without the URL's password."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    reason = first.rsplit("failed: ", 1)[-1].strip()
    passwords = [
        urlsplit(url).password for url in (settings.database_url, settings.broker_url) if url
    ]
    for password in [*passwords, settings.broker_sentinel_password]:
        if password:
            reason = reason.replace(password, "***")
    return reason


def stop_what_this_command_started(command: str) -> None:
    """A short command leaves nothing running that it started without being asked."""
    started = started_here()
    if command in LONG_RUNNING or not started:
        return
    dispose_all()
    embedded.stop(get_settings().data_dir, only=started)
    print(
        f"nightshift: stopped the embedded {' and '.join(started)} this command started "
        "(`nightshift services up` keeps them running)",
        file=sys.stderr,
    )
