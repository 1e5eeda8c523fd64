"""Sending step messages. Always after the commit that made the step runnable."""

from __future__ import annotations

import uuid


def enqueue_step(
    run_id: uuid.UUID,
    *,
    agent: str | None = None,
    step: int | None = None,
    batch: str | None = None,
) -> None:
    """Send `pipeline.step`; agent, step and batch are there so Flower's task list reads well."""
    from pipeline.tasks import step as step_task

    step_task.apply_async(args=[str(run_id)], kwargs={"agent": agent, "step": step, "batch": batch})
