"""Schema upgrades through Alembic (never create_all outside tests of the ORM itself), and the
fresh databases tests and benchmarks migrate and throw away."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from psycopg import sql
from sqlalchemy.engine import make_url

from pipeline.db import database_url, one_off_engine


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", "models:migrations")
    # Alembic's ini parser treats % as interpolation; URLs with escaped passwords need %%.
    rendered = make_url(url or database_url()).render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


def upgrade(url: str | None = None, revision: str = "head") -> None:
    engine = one_off_engine(url or database_url())
    try:
        with engine.begin() as connection:
            config = alembic_config(url)
            config.attributes["connection"] = connection  # models/migrations/env.py uses it
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def current(url: str | None = None) -> str | None:
    engine = one_off_engine(url or database_url())
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


@contextmanager
def fresh_database(url: str, *, template: str | None = None) -> Iterator[str]:
    """The database `url` names, new and empty (or a copy of `template`, a database on the same
    server), dropped with its sessions when the block ends; one that an interrupted run left
    under the name is dropped first. For tests and benchmarks: never point it at real data."""
    parsed = make_url(url)
    admin = parsed.set(drivername="postgresql", database="postgres")
    conninfo = admin.render_as_string(hide_password=False)
    name = sql.Identifier(str(parsed.database))
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name)
    create = sql.SQL("CREATE DATABASE {}").format(name)
    if template is not None:
        create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(drop)
        conn.execute(create)
    try:
        yield url
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(drop)
