"""The PostgreSQL a test's runs live in: the configured server (NIGHTSHIFT_DATABASE_URL) or an
embedded one kept in the temporary directory between sessions; on it a database migrated once
per migration history (the template, named by a digest of the migrations and schema.sql), and a
copy of it for each run, emptied for the next run once the run is gone and dropped when the
process exits."""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import itertools
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import psutil
import psycopg
from psycopg import sql
from sqlalchemy.engine import URL, make_url

import pipeline.embedded as embedded
import pipeline.statements as statements
from pipeline.db import dispose
from pipeline.settings import get_settings

PREFIX = "nightshift_testing_"
_runs = itertools.count()
_lock = threading.Lock()
_templates: dict[str, str] = {}
"""Server (its admin URL) -> the template checked or built there by this process."""


def data_dir() -> Path:
    """The embedded server's home: in the temporary directory, not HOME, so that a test that
    gives each test its own HOME still finds the server (and its template) started before."""
    return Path(tempfile.gettempdir()) / f"nightshift-testing-{os.getuid()}"


@dataclass(frozen=True)
class RunDatabase:
    """A run's own database, a copy of the template."""

    url: str
    admin: str

    def empty(self) -> None:
        """Back to the template's state, for the next run."""
        with _connect(self.url) as conn:
            statements.on_connection(conn, "empty_run_database")

    def drop(self) -> None:
        dispose(self.url)
        with contextlib.suppress(psycopg.Error), _connect(self.admin) as conn:
            name = sql.Identifier(str(make_url(self.url).database))
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


_made: list[RunDatabase] = []
_given_back: list[RunDatabase] = []
"""Databases whose run is gone: the next run takes one (emptied) rather than copying another
from the template, which costs several times as much."""


def take() -> RunDatabase:
    """A database in the template's state, of the server in use, for one run."""
    server = _server()
    admin = _with_database(server, "postgres")
    for database in list(_given_back):
        if database.admin == admin:
            with contextlib.suppress(ValueError):  # another thread took it meanwhile
                _given_back.remove(database)
                database.empty()
                return database
    return _copy(server, admin)


def give_back(database: RunDatabase) -> None:
    """Its run is gone (a finalizer calls this, during garbage collection: no I/O, no lock)."""
    _given_back.append(database)


def _copy(server: URL, admin: str) -> RunDatabase:
    template = _template(admin, server)
    copy = f"{template}_{os.getpid()}_{next(_runs)}"
    name = sql.Identifier(copy)
    with _connect(admin) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(name, sql.Identifier(template))
        )
        # What a test's crash would lose is nothing anyone keeps: each commit need not wait
        # for the disk (a run's steps commit three or four times each).
        conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(name))
    database = RunDatabase(_with_database(server, copy), admin)
    if not _made:
        atexit.register(_drop_made)
    _made.append(database)
    return database


def _drop_made() -> None:
    for database in _made:
        database.drop()


def _server() -> URL:
    """The configured server, else the embedded one (started if it is not running, once a
    process: asking costs a connection)."""
    configured = get_settings().database_url
    if configured:
        return make_url(configured)
    return _embedded()


@functools.cache
def _embedded() -> URL:
    return make_url(embedded.ensure_running(data_dir(), redis=False)["postgres"])


def _with_database(server: URL, name: str) -> str:
    return server.set(database=name).render_as_string(hide_password=False)


def _connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return psycopg.connect(conninfo, autocommit=True)


def _template(admin: str, server: URL) -> str:
    """The migrated template on this server: built once per migration history, by whichever
    process gets there first (the others wait for it), and kept for later sessions."""
    with _lock:
        known = _templates.get(admin)
        if known is not None:
            return known
        name = PREFIX + _history_digest()
        with _connect(admin) as conn:
            if not _exists(conn, name):
                conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (name,))
                if not _exists(conn, name):
                    _build(conn, name, server)
            _drop_left_behind(conn, name)
        _templates[admin] = name
        return name


def _build(conn: psycopg.Connection[tuple[object, ...]], name: str, server: URL) -> None:
    """Migrate a database of its own, then rename it: a template is never seen half-built."""
    # Alembic only here: most sessions find the template built (a third of the import time).
    from pipeline.migrate import upgrade

    building = sql.Identifier(f"{name}_building")
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(building))
    conn.execute(sql.SQL("CREATE DATABASE {}").format(building))
    upgrade(_with_database(server, f"{name}_building"))
    conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(building, sql.Identifier(name)))


def _exists(conn: psycopg.Connection[tuple[object, ...]], name: str) -> bool:
    return bool(conn.execute("SELECT FROM pg_database WHERE datname = %s", (name,)).rowcount)


_RUN_NAME = re.compile(r"_(\d+)_\d+$")


def _drop_left_behind(conn: psycopg.Connection[tuple[object, ...]], template: str) -> None:
    """Run databases of this template whose process is gone (killed before it dropped them)
    and that nobody is connected to."""
    rows = conn.execute(
        """
        SELECT datname FROM pg_database d
         WHERE starts_with(datname, %s)
           AND NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.datid = d.oid)
        """,
        (f"{template}_",),
    ).fetchall()
    for (found,) in rows:
        match = _RUN_NAME.search(str(found))
        if match is None or psutil.pid_exists(int(match.group(1))):
            continue
        with contextlib.suppress(psycopg.Error):
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(str(found))))


def _history_digest() -> str:
    """What the template's schema follows from: every migration and schema.sql."""
    digest = hashlib.sha256()
    migrations = files("models") / "migrations" / "versions"
    scripts = sorted((p for p in migrations.iterdir() if p.name.endswith(".py")), key=str)
    for script in [*scripts, files("models") / "sql" / "schema.sql"]:
        digest.update(script.name.encode() + b"\0" + script.read_bytes())
    return digest.hexdigest()[:12]
