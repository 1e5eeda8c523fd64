"""Waking parked runs: the one path by which a due timer, an approval, a person's resolution or
the settling of another run's action makes a waiting run runnable again. Its step is sent once
the transaction commits."""

from __future__ import annotations

import uuid

from sqlalchemy import ColumnElement, Select, and_, func, or_, select, update
from sqlalchemy.orm import Session

from models import Action, ActionState, Run, RunStatus
from pipeline.app import send_step_after_commit
from pipeline.keys import (
    MODEL_WAIT_PREFIX,
    Wait,
    WaitKind,
    approval_wait,
    conflict_wait,
    person_wait,
)

# What each kind of wait on an action is waiting for the action to leave.
_UNSETTLED: dict[WaitKind, tuple[ActionState, ...]] = {
    WaitKind.APPROVAL: (ActionState.PENDING_APPROVAL,),
    WaitKind.ACTION: (ActionState.OUTCOME_UNKNOWN,),
    WaitKind.CONFLICT: ActionState.in_progress(),
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
            # A parked run's reason (a key conflict) no longer holds once it runs.
            stop_reason=None,
            error=None,
            updated_at=func.now(),
        )
        .returning(Run.id, Run.agent, Run.step, Run.batch_id)
    ).all()
    for row in woken:
        send_step_after_commit(session, row.id, agent=row.agent, step=row.step, batch=row.batch_id)
    return [row.id for row in woken]


def wake_for_action_txn(session: Session, action_key: str) -> list[uuid.UUID]:
    """After the action changed (a decision, a retry): wake every run whose wait on it is
    settled now: its owner waiting for the decision, and other runs waiting for the key."""
    waits = [str(w(action_key)) for w in (approval_wait, person_wait, conflict_wait)]
    settled = _settled_runs().where(Run.waiting_on.in_(waits))
    return wake_txn(session, Run.id.in_(settled.scalar_subquery()))


def wake_due_timers_txn(session: Session, limit: int) -> list[uuid.UUID]:
    """Runs whose timer is due. A wait on the model has its give-up time in wake_at: the
    outages' probe and pacing wake it (pipeline/runs/outages.py), the expiry ends it."""
    due = (
        select(Run.id)
        .where(
            Run.status == RunStatus.WAITING,
            Run.wake_at <= func.now(),
            ~func.coalesce(Run.waiting_on, "").startswith(MODEL_WAIT_PREFIX, autoescape=True),
        )
        .order_by(Run.wake_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return wake_txn(session, Run.id.in_(due.scalar_subquery()))


def wake_settled_txn(session: Session, limit: int) -> list[uuid.UUID]:
    """Runs still parked on an action that was settled: the deciding process died before its
    wake, the decision committed while the run was parking, or another run's action (a key
    conflict) was settled by that run."""
    settled = _settled_runs().limit(limit).with_for_update(of=Run, skip_locked=True)
    return wake_txn(session, Run.id.in_(settled.scalar_subquery()))


def _settled_runs() -> Select[uuid.UUID]:
    kind = func.split_part(Run.waiting_on, ":", 1)
    ref = func.substr(Run.waiting_on, func.strpos(Run.waiting_on, ":") + 1)
    settled = or_(
        *(
            and_(kind == wait.value, Action.state.not_in(unsettled))
            for wait, unsettled in _UNSETTLED.items()
        )
    )
    return (
        select(Run.id)
        .join(Action, Action.idempotency_key == ref)
        .where(Run.status.in_(RunStatus.parked()), settled)
    )


def is_settled_txn(session: Session, waiting_on: str) -> bool:
    """Whether what this wait waits for has happened already (a decision made meanwhile)."""
    wait = Wait.parse(waiting_on)
    unsettled = _UNSETTLED.get(wait.kind)
    if unsettled is None:
        return False
    state = session.scalar(select(Action.state).where(Action.idempotency_key == wait.ref))
    return state is not None and state not in unsettled
