"""The migrations and the ORM describe the same schema."""

from __future__ import annotations

import uuid

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

from models import Base
from pipeline.migrate import current, upgrade
from tests.support import ServiceUrls


def test_an_empty_database_migrated_to_head_matches_the_orm(services: ServiceUrls) -> None:
    name = f"ns_schema_check_{uuid.uuid4().hex[:8]}"  # test sessions side by side never share it
    with psycopg.connect(services.admin_conninfo("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = services.database_url(name)
    try:
        # given an empty database, when it is migrated to head
        upgrade(url)
        # then alembic finds nothing to change between the database and the ORM metadata
        engine = create_engine(url)
        with engine.connect() as conn:
            differences = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        engine.dispose()
        assert differences == []
        assert current(url) is not None
    finally:
        with psycopg.connect(services.admin_conninfo("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
