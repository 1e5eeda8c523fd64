"""The baseline every benchmark compares with: a really plain Celery app, not nightshift's.

Prefork pool, acks_late, prefetch 1, JSON only, no result backend (every result ignored), no
task events, no sent events, no started tracking, WARNING logging. Its one task, `plain.hop`,
commits one row to PostgreSQL through a psycopg connection the pool child keeps (no ORM, no
pool pre-ping) and then sends the next hop: the least a durable chain of Celery tasks can do.

This module is both sides: `celery -A plain_celery worker` (bench/ on PYTHONPATH) reads
PLAIN_DB_URL and PLAIN_BROKER_URL from its environment; the benchmark process imports it to
send the first hop of each chain (`start_chain`) after `configure()`.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
from celery import Celery

QUEUE = "nsbench-plain"

app = Celery("plain_celery")
app.conf.update(
    broker_url=os.environ.get("PLAIN_BROKER_URL", "redis://127.0.0.1:6379/15"),
    broker_connection_retry_on_startup=True,
    result_backend=None,
    task_ignore_result=True,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    worker_send_task_events=False,
    task_send_sent_event=False,
    task_track_started=False,
    task_default_queue=QUEUE,
    worker_hijack_root_logger=False,
    worker_redirect_stdouts=False,
)

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS plain_hops (
    id bigserial PRIMARY KEY,
    chain text NOT NULL,
    hop integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""
_INSERT = "INSERT INTO plain_hops (chain, hop) VALUES (%s, %s)"

_connection: Any = None
"""One connection per pool child, opened by its first hop."""


def _conn() -> Any:
    global _connection
    if _connection is None or _connection.closed:
        _connection = psycopg.connect(os.environ["PLAIN_DB_URL"])
    return _connection


@app.task(name="plain.hop", ignore_result=True)
def hop(chain: str, index: int, length: int) -> None:
    """Commit one row, then send the next hop."""
    conn = _conn()
    conn.execute(_INSERT, (chain, index))
    conn.commit()
    if index + 1 < length:
        hop.apply_async(args=[chain, index + 1, length])


def configure(broker_url: str) -> None:
    """Point this process's sends at the benchmark's broker."""
    app.conf.broker_url = broker_url


def start_chain(chain: str, length: int) -> None:
    hop.apply_async(args=[chain, 0, length])


def libpq_url(url: str) -> str:
    """postgresql+psycopg://... -> postgresql://... (what psycopg itself accepts)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme.split('+', 1)[0]}://{rest}"
