"""The Celery application, and the one way a step message is sent: after the commit that made
the step runnable. Configuration lives in the top-level `celeryconfig` module."""

from __future__ import annotations

import uuid
from typing import Any

from celery import Celery
from sqlalchemy.orm import Session

from pipeline.broker_guard import install as _install_broker_guard
from pipeline.db import after_commit

# Before any broker connection exists: a Redis restart must not kill the worker.
_install_broker_guard()

app = Celery("nightshift")
app.config_from_object("celeryconfig")
app.conf.imports = ("pipeline.tasks",)

STEP_TASK = "pipeline.step"
_PENDING = "nightshift.pending_steps"


def send_step(
    run_id: uuid.UUID,
    *,
    agent: str,
    step: int = 0,
    batch: str | None = None,
    handoffs: int = 0,
    countdown: float | None = None,
) -> None:
    """Send `pipeline.step` now. Everything is a keyword so Flower's task list reads as
    "which run, which agent, which step"; only run_id means anything to the task."""
    kwargs: dict[str, Any] = {"run_id": str(run_id), "agent": agent, "step": step, "batch": batch}
    if handoffs:
        kwargs["handoffs"] = handoffs
    # Nobody reads a step's return value: no result stored, no result subscription here.
    app.send_task(STEP_TASK, kwargs=kwargs, countdown=countdown, ignore_result=True)


def send_step_after_commit(
    session: Session, run_id: uuid.UUID, *, agent: str, step: int = 0, batch: str | None = None
) -> None:
    """Send the run's step once this transaction commits; a run is sent at most once per
    transaction, however many changes in it made the run runnable."""
    pending: dict[uuid.UUID, dict[str, Any]] | None = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = {}
        after_commit(session, lambda: _send_all(pending))
    pending[run_id] = {"agent": agent, "step": step, "batch": batch}


def _send_all(pending: dict[uuid.UUID, dict[str, Any]]) -> None:
    for run_id, labels in pending.items():
        send_step(run_id, **labels)
