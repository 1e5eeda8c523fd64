"""Read models for people: run lists and a run's timeline, as plain JSON-ready dicts."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select

from models import Action, JournalEntry, Run
from pipeline.db import read_only
from pipeline.errors import RunNotFound
from pipeline.runs.summaries import summarize

RUN_FIELDS = (
    "id", "agent", "status", "step", "max_steps", "tool_calls", "input_tokens", "output_tokens",
    "attempt", "fence", "lease_owner", "lease_expires_at", "batch_id", "parent_id", "wake_at",
    "waiting_on", "cancel_requested", "stop_reason", "error", "created_at", "updated_at",
    "finished_at", "idempotency_key", "code_version", "prompt_version",
)  # fmt: skip


def run_dict(run: Run) -> dict[str, Any]:
    return {name: plain(getattr(run, name)) for name in RUN_FIELDS}


def plain(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def list_runs(
    *,
    status: str | None = None,
    agent: str | None = None,
    batch: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    query = select(Run).order_by(Run.created_at.desc()).limit(limit)
    if status:
        query = query.where(Run.status == status)
    if agent:
        query = query.where(Run.agent == agent)
    if batch:
        query = query.where(Run.batch_id == batch)
    with read_only() as session:
        return [run_dict(run) for run in session.scalars(query)]


def show_run(run_id: uuid.UUID) -> dict[str, Any]:
    with read_only() as session:
        run = session.get(Run, run_id)
        if run is None:
            raise RunNotFound(f"no run has id {run_id}")
        entries = session.scalars(
            select(JournalEntry).where(JournalEntry.run_id == run_id).order_by(JournalEntry.id)
        ).all()
        actions = session.scalars(
            select(Action).where(Action.run_id == run_id).order_by(Action.created_at)
        ).all()
        return {
            "run": {**run_dict(run), "input": run.input, "result": run.result, "state": run.state},
            "journal": [
                {
                    "key": e.key,
                    "step": e.step,
                    "step_name": e.step_name,
                    "created_at": e.created_at.isoformat(),
                    "summary": summarize(e.key, e.payload),
                }
                for e in entries
            ],
            "actions": [
                {
                    "idempotency_key": a.idempotency_key,
                    "tool": a.tool,
                    "state": a.state.value,
                    "attempts": a.attempts,
                    "resolution": a.resolution,
                    "decision": a.decision,
                }
                for a in actions
            ],
        }
