"""The scratch database's record as the benchmarks read it: creating bench runs, counting and
waiting for them, the connections opened, and when each step's model reply was journaled."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

from output import Progress
from sqlalchemy import text

from pipeline.processes.celery_process import wait_for

AGENT = "bench"


def sql(statement: str, **params: Any) -> list[Any]:
    from pipeline.db import transaction

    with transaction() as session:
        result = session.execute(text(statement), params)
        return list(result) if result.returns_rows else []


def create_runs(
    count: int, steps: int, label: str = "", *, model_seconds: float = 0
) -> tuple[list[uuid.UUID], float]:
    """Create `count` bench runs in one transaction, whose commit sends each its first step
    (create_run_txn does, once per run). Returns the ids and the time.monotonic() of the
    commit, just before the first send: where a benchmark's clock starts. `model_seconds`:
    the scripted model's latency a step."""
    from pipeline.db import after_commit, transaction
    from pipeline.runs.start import create_run_txn

    run_input: dict[str, Any] = {"steps": steps, "label": label} if label else {"steps": steps}
    if model_seconds:
        run_input["model_seconds"] = model_seconds
    committed: list[float] = []
    with transaction() as session:
        # Registered first, so it runs after the commit and before the sends.
        after_commit(session, lambda: committed.append(time.monotonic()))
        run_ids = [create_run_txn(session, AGENT, run_input).run_id for _ in range(count)]
    return run_ids, committed[0]


def run_counts() -> tuple[int, int]:
    """(terminal runs, failed or cancelled runs) in the scratch database."""
    row = sql(
        "SELECT count(*) FILTER (WHERE status IN ('succeeded', 'failed', 'cancelled')),"
        " count(*) FILTER (WHERE status IN ('failed', 'cancelled')) FROM runs"
    )[0]
    return int(row[0]), int(row[1])


def wait_for_count(
    count: Callable[[], int],
    total: int,
    *,
    timeout: float,
    label: str,
    started: float | None = None,
) -> float:
    """Block until count() reaches `total`, with progress lines; the seconds it took since
    `started` (a time.monotonic() value; default: now)."""
    progress = Progress(label, total, started=started)

    def probe() -> bool:
        done = count()
        progress.update(done)
        return done >= total

    wait_for(probe, timeout=timeout, what=f"{label}: {total}", interval=0.05)
    return time.monotonic() - progress.started


def wait_for_runs(total: int, *, timeout: float, label: str, started: float | None = None) -> float:
    """Block until `total` runs are terminal; fail if any did not succeed. The seconds it took."""
    took = wait_for_count(
        lambda: run_counts()[0], total, timeout=timeout, label=label, started=started
    )
    _, failed = run_counts()
    if failed:
        errors = sql("SELECT stop_reason, error FROM runs WHERE status <> 'succeeded' LIMIT 3")
        raise RuntimeError(f"{failed} run(s) did not succeed, e.g. {errors}")
    return took


def db_sessions() -> int:
    """Connections ever opened to the scratch database (PostgreSQL 14+; -1 if unknown).
    Each one forks a server process: a pool that keeps reconnecting shows up here."""
    try:
        rows = sql("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
    except Exception:  # an older server: the column is missing
        return -1
    return int(rows[0][0]) if rows else -1


def step_times(run_id: uuid.UUID) -> list[tuple[int, float]]:
    """(step, when its model reply was journaled, epoch seconds), in step order."""
    rows = sql(
        "SELECT step, extract(epoch FROM created_at) FROM journal"
        " WHERE run_id = :run_id AND key LIKE 'model:%' ORDER BY step",
        run_id=run_id,
    )
    return [(int(step), float(at)) for step, at in rows]


def step_intervals(run_id: uuid.UUID) -> dict[int, float]:
    """Step k -> seconds from step k-1's journaled model reply to step k's: one full cycle of
    tool call, journal writes, checkpoint, hand-off through the broker, claim, load and model.
    """
    stamps = step_times(run_id)
    return {b[0]: b[1] - a[1] for a, b in itertools.pairwise(stamps)}
