"""A finished run's outcome in Celery's result backend, under the run's own id, for a service
that has only Celery: `AsyncResult(run_id).get(timeout=...)` returns it once the run finished
(status, stop reason, result or error), and no worker is held while the client waits.

The tick publishes what finished since it last looked (a run is marked once its outcome is
stored; a crash in between stores the same outcome again). Outcomes are kept for Celery's
`result_expires` (a day). A run that waits for a person is not finished: nothing is stored.
A batch's children are created published (pipeline/runs/start.py): nothing is stored for them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, select

import pipeline.statements as statements
from models import Run, RunStatus
from pipeline.app import app
from pipeline.db import transaction

BATCH = 200
"""Outcomes stored by one tick at most; the rest wait for the next."""

_FINISHED = [status for status in RunStatus if status.is_terminal()]
_COLUMNS = (
    Run.id, Run.status, Run.stop_reason, Run.waiting_on, Run.wake_at, Run.result, Run.error,
    Run.finished_at,
)  # fmt: skip


def publish_outcomes() -> int:
    """Store the outcome of every finished run not yet published; how many were."""
    unpublished = (
        select(*_COLUMNS)
        .where(Run.outcome_published.is_(False), Run.status.in_(_FINISHED))
        .order_by(Run.finished_at)
        .limit(BATCH)
        .with_for_update(skip_locked=True)
    )
    with transaction() as session:
        rows = session.execute(unpublished).all()
        for row in rows:
            app.backend.store_result(str(row.id), outcome_json(row), "SUCCESS")
        if rows:
            ids = [row.id for row in rows]
            statements.execute(session, "outcomes_published", run_ids=ids)
    return len(rows)


def outcome_json(row: Row[Any]) -> dict[str, Any]:
    """The outcome as `pipeline.views.outcomes.RunOutcome.as_json` writes it (a test holds the
    two to one shape)."""
    return {
        "run_id": str(row.id),
        "status": RunStatus(row.status).value,
        "stop_reason": row.stop_reason,
        "waiting_on": row.waiting_on,
        "wake_at": row.wake_at.isoformat() if row.wake_at else None,
        "result": row.result,
        "error": row.error,
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
    }
