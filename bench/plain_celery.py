"""The baseline every benchmark compares with: a really plain Celery app, not nightshift's.

Prefork pool, acks_late, prefetch 1, JSON only, no result backend (every result ignored), no
task events, no sent events, no started tracking, WARNING logging. Its one task, `plain.hop`,
commits one row to PostgreSQL through a psycopg connection the pool child keeps (no ORM, no
pool pre-ping) and then sends the next hop: the least a durable chain of Celery tasks can do.
`plain.model_hop` first asks the Messages API at PLAIN_MODEL_URL through the anthropic SDK (one
client a process, like nightshift's): the least a chain of model calls on Celery can do
(bench/model_wait.py's baseline). `plain.durable_hop` is the same durable work as a nightshift
step done by hand (bench/batch_throughput.py's and bench/step_overhead.py's floor): run the
in-process stand-in model (sleeping PLAIN_MODEL_SECONDS), commit its reply with a fenced
UPDATE, commit the tool result and the step number with a second fenced UPDATE, then send the
next hop. `plain.batch_hop` is a durable hop of a batch's child chain whose last hop, in its
checkpoint's transaction, counts the child done in its batch's row and, as the last one, creates
the synthesis chain's row, then sends its one durable hop: the join of a fan-out, by hand
(bench/night_scale.py's floor).

This module is both sides: `celery -A plain_celery worker` (bench/ on PYTHONPATH) reads
PLAIN_DB_URL and PLAIN_BROKER_URL from its environment; the benchmark process imports it to
send the first hop of each chain (`start_chain`) after `configure()`.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
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

CREATE_RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS plain_runs (
    id text PRIMARY KEY,
    fence bigint NOT NULL DEFAULT 1,
    step integer NOT NULL DEFAULT 0,
    reply jsonb,
    result jsonb,
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""
_REPLY = "UPDATE plain_runs SET reply = %s, updated_at = now() WHERE id = %s AND fence = %s"
_CHECKPOINT = (
    "UPDATE plain_runs SET result = %s, step = step + 1, updated_at = now()"
    " WHERE id = %s AND fence = %s"
)

CREATE_BATCHES_TABLE = """
CREATE TABLE IF NOT EXISTS plain_batches (
    id text PRIMARY KEY,
    unfinished integer NOT NULL
)
"""
_JOIN = "UPDATE plain_batches SET unfinished = unfinished - 1 WHERE id = %s RETURNING unfinished"
_NEW_CHAIN = "INSERT INTO plain_runs (id) VALUES (%s)"

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


def _stand_in_model(index: int, length: int) -> dict[str, Any]:
    """What the bench agent's script answers at this step, after the same latency."""
    time.sleep(float(os.environ.get("PLAIN_MODEL_SECONDS", "0")))
    if index + 1 < length:
        call = {"type": "tool_use", "id": f"toolu_{index}", "name": "bench_echo"}
        said = {"type": "text", "text": f"Step {index}."}
        return {"content": [said, {**call, "input": {"n": index}}]}
    return {"content": [{"type": "text", "text": f"Done after {length} steps."}]}


def _fenced(
    conn: Any, statement: str, params: tuple[Any, ...], also: Callable[[Any], bool] | None = None
) -> bool:
    """Run one fenced UPDATE (and `also`'s statements, in its transaction) and commit it; a lost
    fence (no row) is an error, as in a step. What `also` returned (False without one)."""
    if conn.execute(statement, params).rowcount != 1:
        conn.rollback()
        raise RuntimeError(f"fence lost on {params[1]}")
    answer = also(conn) if also is not None else False
    conn.commit()
    return answer


def _durable_step(
    chain: str, index: int, length: int, fence: int, last: Callable[[Any], bool] | None = None
) -> tuple[bool, bool]:
    """Run the model, commit its reply (fenced), commit the tool result and the step number
    (fenced; with `last`'s statements on the chain's last hop). (a next hop is due, what `last`
    returned)."""
    reply = _stand_in_model(index, length)
    with _conn() as conn:
        _fenced(conn, _REPLY, (json.dumps(reply), chain, fence))
        calls = [block for block in reply["content"] if block["type"] == "tool_use"]
        result = [{"echo": call["input"]["n"]} for call in calls]
        joined = _fenced(
            conn, _CHECKPOINT, (json.dumps(result), chain, fence), None if calls else last
        )
    return bool(calls), joined


@app.task(name="plain.durable_hop", ignore_result=True)
def durable_hop(chain: str, index: int, length: int, fence: int) -> None:
    """A durable agent step written by hand, then the send of the next hop."""
    if _durable_step(chain, index, length, fence)[0]:
        durable_hop.apply_async(args=[chain, index + 1, length, fence])


def synthesis_chain(batch: str) -> str:
    return f"{batch}:synthesis"


@app.task(name="plain.batch_hop", ignore_result=True)
def batch_hop(chain: str, index: int, length: int, fence: int, batch: str) -> None:
    """A durable hop of a batch's child; the last child's last hop starts the synthesis."""

    def join(conn: Any) -> bool:
        (unfinished,) = conn.execute(_JOIN, (batch,)).fetchone()
        if unfinished == 0:
            conn.execute(_NEW_CHAIN, (synthesis_chain(batch),))
        return bool(unfinished == 0)

    more, last_child = _durable_step(chain, index, length, fence, join)
    if more:
        batch_hop.apply_async(args=[chain, index + 1, length, fence, batch])
    elif last_child:
        durable_hop.apply_async(args=[synthesis_chain(batch), 0, 1, 1])


def configure(broker_url: str) -> None:
    """Point this process's sends at the benchmark's broker."""
    app.conf.broker_url = broker_url


def start_chain(chain: str, length: int, *, model: bool = False) -> None:
    (model_hop if model else hop).apply_async(args=[chain, 0, length])


def start_durable_chains(conn: Any, chains: list[str], length: int) -> float:
    """Create the chains' rows in one commit, then send each chain's first durable hop; the
    time.monotonic() of the commit (where the clock starts, as for nightshift's runs)."""
    with conn.cursor() as cursor:
        cursor.executemany("INSERT INTO plain_runs (id) VALUES (%s)", [(c,) for c in chains])
    conn.commit()
    started = time.monotonic()
    for chain in chains:
        durable_hop.apply_async(args=[chain, 0, length, 1])
    return started


def start_batch(conn: Any, batch: str, children: int, length: int) -> None:
    """The batch's row and its children's chains in one commit, then each child's first
    durable hop; its synthesis hop follows the last child's last hop."""
    chains = [f"{batch}:child:{i}" for i in range(children)]
    with conn.cursor() as cursor:
        cursor.execute(
            "INSERT INTO plain_batches (id, unfinished) VALUES (%s, %s)", (batch, children)
        )
        cursor.executemany(_NEW_CHAIN, [(c,) for c in chains])
    conn.commit()
    for chain in chains:
        batch_hop.apply_async(args=[chain, 0, length, 1, batch])


def libpq_url(url: str) -> str:
    """postgresql+psycopg://... -> postgresql://... (what psycopg itself accepts)."""
    scheme, _, rest = url.partition("://")
    return f"{scheme.split('+', 1)[0]}://{rest}"
