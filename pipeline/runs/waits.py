"""Waking parked runs: the one path by which a due timer, an approval or a person's resolution
makes a waiting run runnable again. Its step is sent once the transaction commits."""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.orm import Session

from models import Action, ActionAudit, ActionState, Run, RunStatus
from pipeline.app import send_step_after_commit
from pipeline.keys import Wait, WaitKind, approval_wait, person_wait

# What each kind of wait a person settles is waiting for the action to leave.
_UNSETTLED = {
    WaitKind.APPROVAL: ActionState.PENDING_APPROVAL,
    WaitKind.ACTION: ActionState.OUTCOME_UNKNOWN,
}


def wake_txn(session: Session, which: ColumnElement[bool]) -> list[uuid.UUID]:
    """Make the parked runs matching `which` runnable; each one's step goes out after commit."""
    woken = session.execute(
        update(Run)
        .where(Run.status.in_(RunStatus.parked()), which)
        .values(
            status=RunStatus.RUNNING,
            waiting_on=None,
            wake_at=None,
            lease_owner=None,
            lease_expires_at=None,
            updated_at=func.now(),
        )
        .returning(Run.id, Run.agent, Run.step, Run.batch_id)
    ).all()
    for row in woken:
        send_step_after_commit(session, row.id, agent=row.agent, step=row.step, batch=row.batch_id)
    return [row.id for row in woken]


def wake_for_action_txn(session: Session, run_id: uuid.UUID, action_key: str) -> bool:
    """After a person decided the action: wake its run if the run waits for that decision."""
    waits = [str(approval_wait(action_key)), str(person_wait(action_key))]
    return bool(wake_txn(session, and_(Run.id == run_id, Run.waiting_on.in_(waits))))


def wake_due_timers_txn(session: Session, limit: int) -> list[uuid.UUID]:
    due = (
        select(Run.id)
        .where(Run.status == RunStatus.WAITING, Run.wake_at <= func.now())
        .order_by(Run.wake_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return wake_txn(session, Run.id.in_(due.scalar_subquery()))


def wake_settled_txn(session: Session, limit: int) -> list[uuid.UUID]:
    """Runs still parked on a decision that was made: the deciding process died before its
    wake, or the decision committed while the run was parking."""
    kind = func.split_part(Run.waiting_on, ":", 1)
    ref = func.substr(Run.waiting_on, func.strpos(Run.waiting_on, ":") + 1)
    settled = or_(
        *(
            and_(kind == wait.value, Action.state != unsettled)
            for wait, unsettled in _UNSETTLED.items()
        )
    )
    decided = (
        select(Run.id)
        .join(Action, Action.idempotency_key == ref)
        .where(Run.status.in_(RunStatus.parked()), settled)
        .limit(limit)
        .with_for_update(of=Run, skip_locked=True)
    )
    return wake_txn(session, Run.id.in_(decided.scalar_subquery()))


def is_settled_txn(session: Session, waiting_on: str) -> bool:
    """Whether what this wait waits for has happened already (a decision made meanwhile)."""
    wait = Wait.parse(waiting_on)
    unsettled = _UNSETTLED.get(wait.kind)
    if unsettled is None:
        return False
    state = session.scalar(select(Action.state).where(Action.idempotency_key == wait.ref))
    return state not in (None, unsettled)


def withdraw_approvals_txn(session: Session, which: ColumnElement[bool], reason: str) -> int:
    """Withdraw the pending approvals of runs that ended (matching `which` on the run): nobody
    will carry them out, so a later approval must be refused rather than pretend. Each
    withdrawal goes on the action's audit trail."""
    ended = select(Run.id).where(which, Run.status.in_(RunStatus.terminal()))
    pending = Action.state == ActionState.PENDING_APPROVAL
    withdrawn = session.execute(
        update(Action)
        .where(Action.run_id.in_(ended.scalar_subquery()), pending)
        .values(state=ActionState.WITHDRAWN, resolution=reason, updated_at=func.now())
        .returning(Action.idempotency_key, Action.run_id)
    ).all()
    via = f"the run ended ({reason})"
    for key, run_id in withdrawn:
        session.add(
            ActionAudit(action_key=key, run_id=run_id, event="withdrawn", by="nightshift", via=via)
        )
    return len(withdrawn)
