"""Waking parked runs: the one path by which a due timer, an approval, a person's resolution or
the settling of another run's action makes a waiting run runnable again. Its step is sent once
the transaction commits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.orm import Session

import pipeline.statements as statements
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


def wake_txn(session: Session, run_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Make those of the runs still parked runnable (runs.sql wake); each one's step goes out
    after commit. The callers choose the runs (a read, locking what it picks)."""
    if not run_ids:
        return []
    woken = statements.rows(session, "wake", run_ids=list(run_ids))
    for row in woken:
        send_step_after_commit(session, row.id, agent=row.agent, step=row.step, batch=row.batch_id)
    return [row.id for row in woken]


def wake_for_action_txn(session: Session, action_key: str) -> list[uuid.UUID]:
    """After the action changed (a decision, a retry): wake every run whose wait on it is
    settled now: its owner waiting for the decision, and other runs waiting for the key."""
    waits = [str(w(action_key)) for w in (approval_wait, person_wait, conflict_wait)]
    settled = _settled_runs().where(Run.waiting_on.in_(waits))
    return wake_txn(session, session.scalars(settled).all())


def wake_waiting_txn(
    session: Session, run_ids: Sequence[uuid.UUID], waiting_on: str
) -> list[uuid.UUID]:
    """Those of the runs still waiting on `waiting_on` (a turn given back: engine/gate.py)."""
    waiting = (
        select(Run.id)
        .where(Run.id.in_(run_ids), Run.status == RunStatus.WAITING, Run.waiting_on == waiting_on)
        .with_for_update(skip_locked=True)
    )
    return wake_txn(session, session.scalars(waiting).all())


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
    return wake_txn(session, session.scalars(due).all())


def wake_settled_txn(session: Session, limit: int) -> list[uuid.UUID]:
    """Runs still parked on an action that was settled: the deciding process died before its
    wake, the decision committed while the run was parking, or another run's action (a key
    conflict) was settled by that run."""
    settled = _settled_runs().limit(limit).with_for_update(of=Run, skip_locked=True)
    return wake_txn(session, session.scalars(settled).all())


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
