"""Deadlines of parked runs: a run waiting on an approval, a timer or a person holds no worker,
so no step would ever see its deadline pass. The tick ends such runs with reason `deadline`
and withdraws their pending approvals, in one transaction, so a later approval is refused."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from models import Run, RunStatus
from pipeline.logs import get_logger
from pipeline.runs import fanout
from pipeline.runs.obligations import settle_actions_of_ended_txn

log = get_logger("nightshift.expiry")

REASON = "deadline"


def expire_parked_txn(session: Session, limit: int) -> list[uuid.UUID]:
    """End the parked runs whose deadline has passed; returns their ids."""
    due = (
        select(Run.id)
        .where(Run.status.in_(RunStatus.parked()), Run.deadline <= func.now())
        .order_by(Run.deadline)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    expired = session.execute(
        update(Run)
        .where(Run.id.in_(due.scalar_subquery()), Run.status.in_(RunStatus.parked()))
        .values(
            status=RunStatus.FAILED,
            stop_reason=REASON,
            error=func.concat("the run's deadline passed while it waited on ", Run.waiting_on),
            finished_at=func.now(),
            wake_at=None,
            updated_at=func.now(),
        )
        .returning(Run.id, Run.batch_id)
    ).all()
    if not expired:
        return []
    ids = [row.id for row in expired]
    settle_actions_of_ended_txn(session, ids, REASON)
    for run_id in ids:  # a batch's synthesis ends its batch
        fanout.synthesis_finished_txn(session, run_id, RunStatus.FAILED)
    for batch_id in sorted({row.batch_id for row in expired if row.batch_id}):
        fanout.child_finished_txn(session, batch_id)
    log.info("ended %d waiting run(s) past their deadline", len(ids))
    return ids
