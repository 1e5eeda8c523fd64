"""The baseline every benchmark compares with: a really plain Celery app, not nightshift's.

Prefork pool, acks_late, prefetch 1, JSON only, no result backend (every result ignored), no
task events, no sent events, no started tracking, WARNING logging. Its one task, `plain.hop`,
commits one row to PostgreSQL through a psycopg connection the pool child keeps (no ORM, no
pool pre-ping) and then sends the next hop: the least a durable chain of Celery tasks can do.
`plain.model_hop` first asks the Messages API at PLAIN_MODEL_URL through the anthropic SDK (one
client a process, like nightshift's): the least a chain of model calls on Celery can do
(bench/model_wait.py's baseline).

This module is both sides: `celery -A plain_celery worker` (bench/ on PYTHONPATH) reads
PLAIN_DB_URL and PLAIN_BROKER_URL from its environment; the benchmark process imports it to
send the first hop of each chain (`start_chain`) after `configure()`.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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

_idle: queue.LifoQueue[Any] = queue.LifoQueue()
"""The process's open connections not in use: a pool child or pool thread borrows one for its
hop. At most PLAIN_DB_CONNECTIONS (default 20) are open per process, as a pooled app would
have: 2 x 100 threads each with its own would pass PostgreSQL's max_connections."""
_opened = 0
_opened_lock = threading.Lock()

_client: Any = None
"""One anthropic client per process (thread-safe; it keeps its connection pool)."""
_client_lock = threading.Lock()

# What the local Messages API server needs to answer as the bench agent (its system prompt).
MODEL_SYSTEM = "You are a benchmark agent. Call bench_echo once a step until the last step."


@contextmanager
def _conn() -> Iterator[Any]:
    global _opened
    try:
        conn = _idle.get_nowait()
    except queue.Empty:
        with _opened_lock:
            may_open = _opened < int(os.environ.get("PLAIN_DB_CONNECTIONS", "20"))
            _opened += may_open
        conn = psycopg.connect(os.environ["PLAIN_DB_URL"]) if may_open else _idle.get()
    try:
        yield conn
    finally:
        _idle.put(conn)


def _model() -> Any:
    global _client
    with _client_lock:
        if _client is None:
            import anthropic

            _client = anthropic.Anthropic(
                api_key="plain-bench", base_url=os.environ["PLAIN_MODEL_URL"], max_retries=5
            )
        return _client


@app.task(name="plain.hop", ignore_result=True)
def hop(chain: str, index: int, length: int) -> None:
    """Commit one row, then send the next hop."""
    with _conn() as conn:
        conn.execute(_INSERT, (chain, index))
        conn.commit()
    if index + 1 < length:
        hop.apply_async(args=[chain, index + 1, length])


@app.task(name="plain.model_hop", ignore_result=True)
def model_hop(chain: str, index: int, length: int) -> None:
    """Ask the model, commit one row, then send the next hop."""
    first = f'Run the benchmark.\n\nInput:\n```json\n{{"steps": {length}}}\n```'
    _model().messages.create(
        model="plain-bench",
        max_tokens=256,
        system=MODEL_SYSTEM,
        messages=[{"role": "user", "content": first}],
    )
    with _conn() as conn:
        conn.execute(_INSERT, (chain, index))
        conn.commit()
    if index + 1 < length:
        model_hop.apply_async(args=[chain, index + 1, length])


def configure(broker_url: str) -> None:
    """Point this process's sends at the benchmark's broker."""
    app.conf.broker_url = broker_url


def start_chain(chain: str, length: int, *, model: bool = False) -> None:
    (model_hop if model else hop).apply_async(args=[chain, 0, length])


def libpq_url(url: str) -> str:
    """postgresql+psycopg://... -> postgresql://... (what psycopg itself accepts)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme.split('+', 1)[0]}://{rest}"
