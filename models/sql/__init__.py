"""The SQL truth in one place (docs/internals.md, "Where the SQL is").

- `schema.sql`: the one current definition of nightshift's PL/pgSQL functions and triggers,
  with the call migrations use to apply it.
- The named statements: every statement that writes the durable record (runs and their
  leases, the journal, actions, batches, and what those writes bring along), one file per
  group, each statement under a `-- name:` line, its name unique across the files:
  `step.sql` what every step runs (the claim and what it loads, the journal writes, the
  checkpoint, the lease renewal); `runs.sql` a run's other changes (creation, fenced writes,
  park, finish, wake, cancel, the tick's takeovers, expiry); `actions.sql` the action
  protocol's rows and their audit trail (tool side effects and webhooks alike);
  `batches.sql` batches, their join and the budget stops; `webhooks.sql` what only webhook
  actions have (alerts raised, delivery tasks dispatched, a sender's claim, retries);
  `outages.sql` the model provider's outages; `retention.sql` a finished run's compaction and
  deletion; `bulk.sql` bulk operations and their items; `testing.sql` what only pipeline.testing
  runs, on a database a test owns (its clock). `pipeline/statements.py` runs them, and
  nothing else writes those tables.

Read models (pipeline/views) may stay in SQLAlchemy Core.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from sqlalchemy.engine import Connection

SCHEMA_FILE = "schema.sql"
STATEMENT_FILES = (
    "step.sql", "runs.sql", "actions.sql", "batches.sql", "webhooks.sql", "outages.sql",
    "retention.sql", "bulk.sql", "testing.sql",
)  # fmt: skip
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
def queries() -> dict[str, str]:
    """Every named statement, by name: each block from its `-- name:` line to the next,
    without its comments (psycopg would read a `%` in a comment as a placeholder). A name
    given twice is an error naming both files."""
    found: dict[str, str] = {}
    where: dict[str, str] = {}
    for file in STATEMENT_FILES:
        text = files(__name__).joinpath(file).read_text(encoding="utf-8")
        for block in text.split(_NAME)[1:]:
            name, _, body = block.partition("\n")
            name = name.strip()
            if name in found:
                raise ValueError(f"statement {name!r} is named in {where[name]} and in {file}")
            lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
            found[name] = "\n".join(lines).strip().rstrip(";").strip()
            where[name] = file
    return found
