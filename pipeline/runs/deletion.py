"""Retention's second stage: a compacted run's record is deleted once its deletion window has
passed, with everything that points at it; a batch goes with its last run.

Never deleted: a run with an open obligation (its actions are what a person or the next run
settles), a run whose child runs are still kept, a run not yet compacted. Deleting a settled
action frees its key: a run that means the same action after that sends it again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, exists, select
from sqlalchemy.orm import Session, aliased

import pipeline.statements as statements
from models import Action, Run, RunStatus
from pipeline.runs.redaction import open_obligation


@dataclass(frozen=True)
class DeletedRun:
    """A compact record the second stage deletes (or, in a dry run, would delete)."""

    run_id: uuid.UUID
    agent: str
    status: str
    compacted_at: datetime


def _deletable(cutoff: datetime) -> Any:
    child = aliased(Run)
    return and_(
        Run.compacted_at < cutoff,
        Run.status.in_(RunStatus.terminal()),
        ~exists().where(Action.run_id == Run.id, open_obligation()),
        ~exists().where(child.parent_id == Run.id),
    )


def deletable_txn(session: Session, cutoff: datetime, limit: int) -> list[DeletedRun]:
    rows = session.execute(
        select(Run.id, Run.agent, Run.status, Run.compacted_at)
        .where(_deletable(cutoff))
        .order_by(Run.compacted_at)
        .limit(limit)
    ).all()
    return [DeletedRun(r.id, r.agent, str(r.status), r.compacted_at) for r in rows]


def delete_run_txn(session: Session, run_id: uuid.UUID, cutoff: datetime) -> bool:
    """Delete one compact record; False if it is no longer deletable (it gained an obligation
    or a child meanwhile)."""
    locked = session.execute(
        select(Run.id, Run.batch_id)
        .where(Run.id == run_id, _deletable(cutoff))
        .with_for_update(of=Run)
    ).one_or_none()
    if locked is None:
        return False
    statements.execute(session, "delete_run", run_id=run_id)  # and what goes with it
    if locked.batch_id is not None:
        statements.execute(session, "delete_batch_if_empty", batch_id=locked.batch_id)
    return True
