"""The durable protocol by name: the statements of models/sql/ (every write to runs and their
leases, the journal, actions and batches) run here, and nowhere else.

Two ways to run them, one set of names:
- in the caller's transaction (`execute`, `first`, `rows`): on the session's own connection, so
  the statement commits or rolls back with the rest of the transaction, and fails as any
  statement of the session does (SQLAlchemy's errors);
- as a transaction of their own, in one round trip (`pipelined`): the step's hot path.

Parameters are psycopg's (`%(name)s`): a JSON value goes in as `jsonb(value)`, a variable
number of rows as arrays, one a column, that the statement reads with `unnest` (never SQL built
from strings). Rows carry psycopg's values: a status is its string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb
from sqlalchemy import CursorResult, Row
from sqlalchemy.orm import Session

import pipeline.db as db
from models.sql import queries


def jsonb(value: Any) -> Jsonb:
    """A JSON parameter (None too is JSON: `null`, as SQLAlchemy's JSON columns store it)."""
    return Jsonb(value)


def sql(name: str) -> str:
    """The statement's text; KeyError names a statement no file defines."""
    return queries()[name]


def _execute(session: Session, name: str, params: Mapping[str, Any]) -> CursorResult[Any]:
    # What the session holds unflushed goes first, as before any statement the session runs.
    session.flush()
    return session.connection().exec_driver_sql(sql(name), dict(params))


def rows(session: Session, name: str, /, **params: Any) -> Sequence[Row[Any]]:
    """Every row the statement returns, in the session's transaction."""
    return _execute(session, name, params).all()


def first(session: Session, name: str, /, **params: Any) -> Row[Any] | None:
    """The statement's first row (None: none), in the session's transaction."""
    return _execute(session, name, params).first()


def execute(session: Session, name: str, /, **params: Any) -> int:
    """Run the statement in the session's transaction: how many rows it changed."""
    return _execute(session, name, params).rowcount


def pipelined(statements: Sequence[tuple[str, Mapping[str, Any]]]) -> list[list[Any]]:
    """Run the named statements as one transaction in one round trip, on one of the pool's
    psycopg connections: each statement's rows (named tuples; every statement returns rows).
    They go out together in pipeline mode, prepared unless a pooler stands in between
    (db.PREPARE_THRESHOLD: the connection's own switch), and PostgreSQL runs everything before
    the pipeline's Sync as one implicit transaction, committed at the Sync, or rolled back as a
    whole when one statement fails (raised here). A transaction() takes a round trip a
    statement, plus BEGIN and COMMIT. For the statements every step runs
    (pipeline/engine/step_sql.py). A connection that broke is dropped from the pool."""
    pooled = db.get_engine().raw_connection()
    connection: psycopg.Connection[Any] = pooled.driver_connection  # type: ignore[assignment]
    try:
        connection.autocommit = True  # no BEGIN: the Sync ends the implicit transaction
        prepare = connection.prepare_threshold is not None
        if len(statements) == 1:  # a transaction of its own already: no pipeline to keep
            ((name, params),) = statements
            cursor = connection.cursor(row_factory=namedtuple_row)
            return [cursor.execute(sql(name), params, prepare=prepare).fetchall()]
        cursors = []
        with connection.pipeline():
            for name, params in statements:
                cursor = connection.cursor(row_factory=namedtuple_row)
                cursor.execute(sql(name), params, prepare=prepare)
                cursors.append(cursor)
        return [cursor.fetchall() for cursor in cursors]
    except BaseException:
        if connection.broken:
            pooled.invalidate()
        raise
    finally:
        try:
            if not connection.closed:
                connection.autocommit = False  # as SQLAlchemy's sessions expect it
        except psycopg.Error:  # still mid-statement (an interrupt): not fit to go back
            pooled.invalidate()
        pooled.close()


def on_connection(
    connection: psycopg.Connection[Any], name: str, /, **params: Any
) -> psycopg.Cursor[Any]:
    """Run the statement on a psycopg connection of the caller's own, outside the pool (a
    test's database: models/sql/testing.sql)."""
    return connection.execute(sql(name), params or None)
