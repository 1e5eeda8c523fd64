"""The migrations and the ORM describe the same schema."""

from __future__ import annotations

import uuid

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from models import Base
from models.sql import apply_schema
from pipeline.migrate import current, fresh_database, upgrade
from tests.support import ServiceUrls


def test_an_empty_database_migrated_to_head_matches_the_orm(services: ServiceUrls) -> None:
    name = f"ns_schema_check_{uuid.uuid4().hex[:8]}"  # test sessions side by side never share it
    with fresh_database(services.database_url(name)) as url:
        # given an empty database, when it is migrated to head
        upgrade(url)
        # then alembic finds nothing to change between the database and the ORM metadata
        engine = create_engine(url)
        with engine.connect() as conn:
            differences = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        engine.dispose()
        assert differences == []
        assert current(url) is not None


# The database's own rendering of each function and trigger nightshift defines (not those an
# extension brought), so a body changed by hand or by a migration that bypassed schema.sql shows.
_FUNCTIONS = """
SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace
   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
"""
_TRIGGERS = """
SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
 JOIN pg_class c ON c.oid = t.tgrelid
 WHERE NOT t.tgisinternal AND c.relnamespace = 'public'::regnamespace
"""


def _definitions(conn: Connection) -> dict[str, dict[str, str]]:
    return {
        "functions": {name: body for name, body in conn.exec_driver_sql(_FUNCTIONS)},
        "triggers": {name: body for name, body in conn.exec_driver_sql(_TRIGGERS)},
    }


def test_a_database_migrated_to_head_has_exactly_the_functions_and_triggers_of_schema_sql(
    services: ServiceUrls,
) -> None:
    name = f"ns_schema_sql_{uuid.uuid4().hex[:8]}"
    with fresh_database(services.database_url(name)) as url:
        # given an empty database migrated to head
        upgrade(url)
        engine = create_engine(url)
        with engine.connect() as conn:
            migrated = _definitions(conn)
            # when every function goes (its triggers with it) and schema.sql alone rebuilds them,
            # in a transaction that is then rolled back
            for function in migrated["functions"]:
                conn.exec_driver_sql(f"DROP FUNCTION {function} CASCADE")
            assert _definitions(conn) == {"functions": {}, "triggers": {}}
            apply_schema(conn)
            rebuilt = _definitions(conn)
            conn.rollback()
        engine.dispose()
        # then the file and the migrations agree on every name and every body
        assert migrated["functions"] and migrated["triggers"]
        assert rebuilt == migrated


def test_schema_sql_applies_twice_without_change(services: ServiceUrls) -> None:
    name = f"ns_schema_sql_{uuid.uuid4().hex[:8]}"
    with fresh_database(services.database_url(name)) as url:
        upgrade(url)
        engine = create_engine(url)
        with engine.connect() as conn:
            before = _definitions(conn)
            # idempotent: a migration may re-apply the file whatever state it finds
            apply_schema(conn)
            apply_schema(conn)
            assert _definitions(conn) == before
            conn.rollback()
        engine.dispose()
