"""Cancelling runs: a waiting run stops at once; a running one at its next check."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import Run, RunStatus
from pipeline.db import transaction
from pipeline.errors import RunNotFound
from pipeline.logs import get_logger
from pipeline.runs.notifications import dispatch_new_txn
from pipeline.runs.obligations import settle_actions_of_ended_txn

log = get_logger("nightshift.cancel")


@dataclass(frozen=True)
class CancelResult:
    run_id: uuid.UUID
    status: RunStatus
    """The run's status after the request: cancelled, or still running until its next check."""
    ended_before: bool = False
    """The run had ended already (its status says how): nothing was changed."""


def cancel_run_txn(
    session: Session, run_id: uuid.UUID, by: str, reason: str = "cancelled"
) -> CancelResult:
    status = session.scalar(select(Run.status).where(Run.id == run_id).with_for_update())
    if status is None:
        raise RunNotFound(f"no run has id {run_id}")
    if status.is_terminal():
        return CancelResult(run_id, status, ended_before=True)
    # Parked runs hold no worker, so nobody else would ever notice the request: it ends them.
    statements.execute(session, "request_cancel", run_id=run_id, by=by, reason=reason)
    settle_actions_of_ended_txn(session, [run_id], reason)
    dispatch_new_txn(session)
    new = RunStatus.CANCELLED if status.is_parked() else status
    log.info("run %s: cancel requested by %s (%s)", run_id, by, new)
    return CancelResult(run_id, new)


def cancel_batch_txn(
    session: Session, batch_id: str, by: str, reason: str = "cancelled"
) -> list[CancelResult]:
    """Stop a batch: no synthesis starts for it any more, and its unfinished runs (children,
    and a synthesis already started) are cancelled like any run."""
    synthesis = statements.first(session, "cancel_batch", batch_id=batch_id, reason=reason)
    if synthesis is None:
        return []  # finished or stopped already
    mine = Run.batch_id == batch_id
    if synthesis.synthesis_run_id is not None:
        mine = or_(mine, Run.id == synthesis.synthesis_run_id)
    unfinished = session.scalars(
        select(Run.id).where(mine, Run.status.not_in(RunStatus.terminal())).order_by(Run.id)
    ).all()
    log.info("batch %s: stopped by %s (%s); cancelling %d run(s)", batch_id, by, reason,
             len(unfinished))  # fmt: skip
    return [cancel_run_txn(session, run_id, by, reason) for run_id in unfinished]


def cancel_run(run_id: uuid.UUID, by: str, reason: str = "cancelled") -> CancelResult:
    with transaction() as session:
        return cancel_run_txn(session, run_id, by, reason)
