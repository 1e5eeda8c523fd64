"""Thin Celery tasks: ids in, call the engine, send the next message after the commit."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any

from pipeline import engine, runs
from pipeline import tick as ticker
from pipeline.app import app
from pipeline.handoff import enqueue_step
from pipeline.settings import get_settings

log = logging.getLogger("nightshift.tasks")


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"


@app.task(name="pipeline.start_run")
def start_run(agent: str, input: dict[str, Any], idempotency_key: str | None = None) -> str:
    """Start a run from another service: `start_run.delay(agent, input, key).get()` is its id."""
    return str(runs.start_run(agent, input, idempotency_key).run_id)


@app.task(
    name="pipeline.step",
    bind=True,
    acks_late=True,
    retry_on_worker_lost=True,
    max_retries=get_settings().worker_lost_max_retries,
    default_retry_delay=1,
)
def step(
    self: Any,
    run_id: str,
    agent: str | None = None,
    step: int | None = None,
    batch: str | None = None,
) -> str:
    """One durable step of a run. agent, step and batch are only labels for Flower."""
    result = engine.execute_step(uuid.UUID(run_id), worker_id())
    if result.outcome is engine.Outcome.CONTINUE:
        from pipeline.crash import crash_point

        crash_point("after_checkpoint_before_enqueue")
        enqueue_step(result.run_id, agent=result.agent, step=result.step, batch=result.batch)
    return result.outcome.value


@app.task(name="pipeline.tick", ignore_result=True)
def tick() -> dict[str, int]:
    report = ticker.tick()
    return {"resumed": len(report.resumed), "woken": len(report.woken)}
