"""Schema upgrades through Alembic (never create_all outside tests of the ORM itself)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from pipeline.db import database_url


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", "models:migrations")
    # Alembic's ini parser treats % as interpolation; URLs with escaped passwords need %%.
    rendered = make_url(url or database_url()).render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


def upgrade(url: str | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def current(url: str | None = None) -> str | None:
    engine = create_engine(url or database_url())
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
