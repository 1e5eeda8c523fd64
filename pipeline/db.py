"""Connections: the URLs in use (configured or embedded), one engine per process, sessions,
and work that must wait until a transaction has committed (sending step messages)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from threading import Lock
from typing import Any

import psycopg
import redis
from redis.sentinel import Sentinel
from sqlalchemy import Engine, create_engine, event, exc, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, NullPool

import pipeline.embedded as embedded
from pipeline.settings import Settings, broker_urls, get_settings, postgres_urls

_lock = Lock()
_engines: dict[tuple[int, str], Engine] = {}
_factories: dict[Engine, sessionmaker[Session]] = {}
_embedded_urls: dict[str, str] = {}
_started_here: list[str] = []


def _embedded(settings: Settings) -> dict[str, str]:
    """Start (or reuse) the embedded services for whichever URL is not configured."""
    with _lock:
        if not _embedded_urls:
            running = {info.name for info in embedded.status(settings.data_dir) if info.running}
            _embedded_urls.update(
                embedded.ensure_running(
                    settings.data_dir,
                    postgres=settings.database_url is None,
                    redis=settings.broker_url is None,
                )
            )
            _started_here.extend(name for name in _embedded_urls if name not in running)
    return _embedded_urls


def started_here() -> list[str]:
    """The embedded services this process found stopped and started (a short CLI command
    stops them again, so that it leaves nothing running it was not asked to start)."""
    return list(_started_here)


def database_url(settings: Settings | None = None) -> str:
    settings = settings or get_settings()
    return settings.database_url or _embedded(settings)["postgres"]


def conninfo(settings: Settings | None = None) -> str:
    """The database as libpq's connection string, for a connection outside SQLAlchemy's pool
    that must go where the pool's go (its hosts in turn, with their options)."""
    return postgres_urls.conninfo(database_url(settings))


def broker_url(settings: Settings | None = None) -> str:
    settings = settings or get_settings()
    return settings.broker_url or _embedded(settings)["redis"]


def broker_client(settings: Settings | None = None, *, timeout: float) -> redis.Redis:
    """A client of the broker's Redis for nightshift's own commands outside Celery (queue
    depth, health), each with `timeout`. Through Sentinel it asks the sentinels for the master
    on each new connection, as kombu's transport does, so it follows a failover too."""
    settings = settings or get_settings()
    url = broker_url(settings)
    if not broker_urls.is_sentinel(url):
        return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    sentinels = broker_urls.sentinels_of(url)
    timeouts: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    servers = dict(timeouts, **settings.broker_sentinel_tls_options or {})
    if settings.broker_sentinel_tls:
        servers["ssl"] = True  # redis-py's sentinel pool then makes TLS connections
    watchers = Sentinel(
        list(sentinels.addresses),
        sentinel_kwargs={**timeouts, **settings.broker_sentinel_kwargs},
        **servers,
    )
    return watchers.master_for(
        settings.broker_sentinel_master or "",
        db=sentinels.db,
        username=sentinels.username,
        password=sentinels.password,
    )


def ping_database(timeout: float) -> None:
    """`select 1` on a connection of its own within `timeout` (a pooled one could hang on a dead
    network); raises what the connection raised."""
    with psycopg.connect(conninfo(), connect_timeout=max(1, round(timeout))) as connection:
        connection.execute("select 1")


def ping_broker(timeout: float) -> None:
    """PING the broker's Redis within `timeout`; raises what the client raised."""
    client = broker_client(get_settings(), timeout=timeout)
    try:
        client.ping()
    finally:
        client.close()


def get_engine(url: str | None = None) -> Engine:
    """One engine (and connection pool) per process and URL; a forked child gets its own."""
    url = url or database_url()
    key = (os.getpid(), url)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            # A fixed set of connections, whatever --concurrency is: a thread waits for one
            # (a transaction takes milliseconds; a step holds none while its model thinks)
            # instead of opening and closing overflow connections on every burst, and
            # processes x db_pool_size bounds what the deployment asks of max_connections.
            # A thread that waited a lease has lost its lease anyway: it gives up then.
            settings = get_settings()
            engine = create_engine(
                url,
                pool_size=settings.db_pool_size,
                max_overflow=0,
                pool_timeout=settings.lease_seconds,
                # The most recently used connection first: under load a few stay busy (and
                # need no ping, below), the rest idle until they are needed or recycled.
                pool_use_lifo=True,
                pool_recycle=1800,
                connect_args=connect_args(settings),
            )
            _ping_when_idle(engine)
            _prepare_unless_pooled(engine)
            _engines[key] = engine
    return engine


PING_IDLE_SECONDS = 1.0
"""A pooled connection idle this long is pinged before use: PostgreSQL may have restarted or
the network gone meanwhile. One that was in use a moment ago is not (the ping is a round trip,
once per transaction: four a step with `pool_pre_ping`); should its server have died in that
moment, the transaction fails as it would mid-way, and SQLAlchemy then invalidates every
connection of the pool older than the failure."""


def _ping_when_idle(engine: Engine) -> None:
    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi: object, record: ConnectionPoolEntry) -> None:
        record.info["checked_in"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checking_out(dbapi: object, record: ConnectionPoolEntry, _proxy: object) -> None:
        checked_in = record.info.get("checked_in")
        if checked_in is None or time.monotonic() - checked_in < PING_IDLE_SECONDS:
            return  # just opened, or just used
        try:
            alive = engine.dialect.do_ping(dbapi)  # type: ignore[arg-type]
        except engine.dialect.loaded_dbapi.Error as error:
            raise exc.DisconnectionError(f"pooled connection is dead: {error}") from error
        if not alive:
            raise exc.DisconnectionError("pooled connection is dead")


PREPARE_THRESHOLD: int | None = 5
"""Statements run this often on one connection are prepared on the server (psycopg's default;
pipeline/statements.py's pipelined() prepares its statements at once): PostgreSQL then plans
them once, not each time.
Only on a connection that is PostgreSQL's own session: a transaction pooler (PgBouncer in
transaction mode) hands each transaction to whichever server connection is free, where a
statement prepared on another does not exist, or exists under the same name for another
statement. So every connection starts with preparation off (connect_args) and turns it on once
it found no pooler in between (`_prepare_unless_pooled`). bench/README.md has what it saves."""


def behind_pooler(connection: psycopg.Connection[Any]) -> bool:
    """Whether a pooler stands between this connection and PostgreSQL. A pooler that hands
    transactions to several server connections answers the client's startup with a cancel key
    of its own, whose process id is no PostgreSQL backend's (PgBouncer's is random): it then
    differs from the server process that runs this session's statement. A TCP proxy passes the
    server's through. One round trip; the transaction it opens is rolled back."""
    row = connection.execute(BACKEND_PID).fetchone()
    if not connection.autocommit:
        connection.rollback()
    return is_pooled(connection.info.backend_pid, row[0] if row else None)


BACKEND_PID = "SELECT pg_backend_pid()"
"""The server process that runs this session's statement."""


def is_pooled(reported_pid: int, session_pid: int | None) -> bool:
    """Whether a connection whose startup reported `reported_pid` (psycopg's
    `info.backend_pid`) and whose statement ran in `session_pid` (BACKEND_PID) goes through a
    pooler (`behind_pooler`)."""
    return session_pid != reported_pid


def _prepare_unless_pooled(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connected(dbapi: psycopg.Connection[Any], _record: ConnectionPoolEntry) -> None:
        if not behind_pooler(dbapi):
            dbapi.prepare_threshold = PREPARE_THRESHOLD


def connect_args(settings: Settings) -> dict[str, object]:
    """What makes a partitioned network fail fast instead of after TCP's defaults (minutes):
    connecting gives up after 10 s, a statement whose packets go unanswered after a lease
    (tcp_user_timeout), an idle connection is probed by keepalives; and PostgreSQL ends a
    session idle inside a transaction for a lease, so a worker cut off mid-transaction does
    not keep its run's row locked (a takeover would wait for the partition to heal). A pooler
    drops that startup option (PgBouncer: `ignore_startup_parameters = options`): the role's
    own setting then applies (docs/operations.md). Nothing is prepared until the connection is
    known to be PostgreSQL's own session (PREPARE_THRESHOLD)."""
    lease_ms = int(settings.lease_seconds * 1000)
    return {
        "prepare_threshold": None,
        "connect_timeout": 10,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": lease_ms,
        "options": f"-c idle_in_transaction_session_timeout={lease_ms}",
    }


def one_off_engine(url: str) -> Engine:
    """An engine for one short job outside the process's pool (a migration): its connections
    prepare nothing, as any connection not known to be PostgreSQL's own session."""
    return create_engine(url, poolclass=NullPool, connect_args={"prepare_threshold": None})


def session_factory(url: str | None = None) -> sessionmaker[Session]:
    """One sessionmaker per engine: each new one is a new Session subclass whose event
    dispatch SQLAlchemy builds on first use (the profile of issue 14: ~1-2.5 ms a step)."""
    engine = get_engine(url)
    factory = _factories.get(engine)
    if factory is None:
        with _lock:
            factory = _factories.setdefault(engine, sessionmaker(engine, expire_on_commit=False))
    return factory


_AFTER_COMMIT = "nightshift.after_commit"


@contextmanager
def transaction(url: str | None = None) -> Iterator[Session]:
    """A session inside one transaction: committed on success, rolled back on any exception.

    What `after_commit` registered runs once the commit succeeded, in order; never on rollback.
    """
    with session_factory(url)() as session:
        with session.begin():
            yield session
        callbacks: list[Callable[[], None]] = session.info.pop(_AFTER_COMMIT, [])
    for callback in callbacks:
        callback()


@contextmanager
def read_only(url: str | None = None) -> Iterator[Session]:
    """A transaction PostgreSQL refuses to write in: what the read models (views/) use. It
    holds no lock a takeover waits for, so PostgreSQL ends it idle only after a minute (or a
    lease, if longer), not after a lease: a page or `/metrics` read by a process the machine
    left unscheduled for a few seconds is not cut off between two of its queries."""
    idle_ms = int(max(READER_IDLE_SECONDS, get_settings().lease_seconds) * 1000)
    with transaction(url) as session:
        session.execute(_READ_ONLY, {"idle_ms": str(idle_ms)})
        yield session


READER_IDLE_SECONDS = 60.0
_READ_ONLY = text(
    "SELECT set_config('transaction_read_only', 'on', true),"
    " set_config('idle_in_transaction_session_timeout', :idle_ms, true)"
)


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    """Run `callback` after the session's transaction commits (a step message must never be
    seen by a worker before the row that makes the step runnable)."""
    session.info.setdefault(_AFTER_COMMIT, []).append(callback)


def dispose_all() -> None:
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _factories.clear()


def dispose(url: str) -> None:
    """Close this process's connections to `url` and forget its engine (a database about to be
    dropped: a test's run's own)."""
    with _lock:
        engine = _engines.pop((os.getpid(), url), None)
        if engine is not None:
            _factories.pop(engine, None)
            engine.dispose()
