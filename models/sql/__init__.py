"""The SQL truth in one place (docs/internals.md, "SQL in one place"): schema.sql, the one
current definition of nightshift's PL/pgSQL functions and triggers, with the call migrations
use to apply it; queries.sql, the statements every step runs, by name; and testing.sql, the
statements only pipeline.testing runs, on a database a test owns (its clock)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from sqlalchemy.engine import Connection

SCHEMA_FILE = "schema.sql"
QUERIES_FILE = "queries.sql"
TESTING_FILE = "testing.sql"
_NAME = "-- name: "


def schema_sql() -> str:
    """The text of schema.sql as installed with the package (wheel or checkout)."""
    return files(__name__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


def apply_schema(connection: Connection) -> None:
    """Create or replace every function and trigger schema.sql defines, in the caller's
    transaction. Straight to the driver: SQLAlchemy would read the notification keys'
    `:finished` as a bind parameter."""
    connection.exec_driver_sql(schema_sql())


@cache
def queries(file: str = QUERIES_FILE) -> dict[str, str]:
    """A file's statements by name (each block from its `-- name:` line to the next), without
    their comments: psycopg would read a `%` in a comment as a placeholder."""
    text = files(__name__).joinpath(file).read_text(encoding="utf-8")
    found: dict[str, str] = {}
    for block in text.split(_NAME)[1:]:
        name, _, body = block.partition("\n")
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        found[name.strip()] = "\n".join(lines).strip().rstrip(";").strip()
    return found
