"""The baseline the benchmarks compare with: plain Celery tasks that each commit one row.

Registered on nightshift's own Celery app, so they share its broker, settings (acks_late,
prefetch 1, JSON, result backend) and database engine; workers load this module with
`--include=baseline_tasks` (bench/ is on their PYTHONPATH).
"""

from __future__ import annotations

from sqlalchemy import text

from pipeline.app import app
from pipeline.db import transaction

CREATE_TABLE = text(
    """
    CREATE TABLE IF NOT EXISTS bench_hops (
        id bigserial PRIMARY KEY,
        chain text NOT NULL,
        hop integer NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    )
    """
)

_INSERT = text("INSERT INTO bench_hops (chain, hop) VALUES (:chain, :hop)")


@app.task(name="bench.hop")
def hop(chain: str, index: int, length: int) -> None:
    """Commit one row, then send the next hop: the least a durable step chain can do."""
    commit_one(chain, index)
    if index + 1 < length:
        hop.apply_async(args=[chain, index + 1, length])


def commit_one(chain: str, index: int) -> None:
    with transaction() as session:
        session.execute(_INSERT, {"chain": chain, "hop": index})


def create_table() -> None:
    with transaction() as session:
        session.execute(CREATE_TABLE)


def start_chain(chain: str, length: int) -> None:
    hop.apply_async(args=[chain, 0, length])
