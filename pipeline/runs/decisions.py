"""People's decisions about actions: approve or reject a pending one, resolve an unknown one.

Each is a compare-and-set on the action row: the first decision wins, an identical second one
returns the first outcome, a conflicting one is refused. The run is woken after the commit.
Who decides is an Actor the caller authenticated (a token, a proxy header, the operator CLI);
every decision is also appended to the action's audit trail with how it was authenticated.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import func, or_, select, true, update
from sqlalchemy.orm import Session

from models import Action, ActionAudit, ActionState, Run, RunStatus
from pipeline.db import transaction
from pipeline.errors import NightshiftError, StatusConflict, UnknownAction
from pipeline.logs import get_logger
from pipeline.runs.waits import wake_for_action_txn

log = get_logger("nightshift.decisions")


class DecisionConflict(StatusConflict):
    """A different decision was already made for this action."""


class NotAnApprover(NightshiftError):
    """This person is not among the action's approvers."""


@dataclass(frozen=True)
class Actor:
    """Who acts on an action, as established by the caller, never as a request claims."""

    identity: str
    """Recorded as `decided_by` and matched against the action's approvers."""
    via: str
    """How the identity was established, for the audit trail: `token nst_ab12cd34`,
    `proxy header X-Forwarded-Email`, `cli (OS user)`, `cli --as (OS user alice)`."""


class Decision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    HAPPENED = "happened"
    DID_NOT_HAPPEN = "did_not_happen"


@dataclass(frozen=True)
class DecisionResult:
    action_key: str
    decision: Decision
    decided_by: str
    first: bool
    """False when this repeated a decision already made (nothing changed)."""
    state: ActionState
    run_id: uuid.UUID


# What each decision requires and produces.
_RULES: dict[Decision, tuple[ActionState, ActionState]] = {
    Decision.APPROVE: (ActionState.PENDING_APPROVAL, ActionState.INTENDED),
    Decision.REJECT: (ActionState.PENDING_APPROVAL, ActionState.REJECTED),
    Decision.HAPPENED: (ActionState.OUTCOME_UNKNOWN, ActionState.CONFIRMED),
    Decision.DID_NOT_HAPPEN: (ActionState.OUTCOME_UNKNOWN, ActionState.INTENDED),
}


def decide(
    key: str, decision: Decision | str, actor: Actor, note: str | None = None
) -> DecisionResult:
    """Record a person's decision once and wake the run that waits for it."""
    decision = Decision(decision)
    with transaction() as session:
        result = decide_txn(session, key, decision, actor, note)
    if result.first:
        _wake(result.run_id, result.action_key)
    return result


def decide_txn(
    session: Session, key: str, decision: Decision, actor: Actor, note: str | None
) -> DecisionResult:
    by = actor.identity
    required, new = _RULES[decision]
    values: dict[str, Any] = {
        "state": new,
        "decision": decision.value,
        "decided_by": by,
        "decided_at": func.now(),
        "note": note,
    }
    if decision is Decision.HAPPENED:
        values["result"] = {"resolved_by": by, "note": note, "happened": True}
        values["resolution"] = "person_happened"
    elif decision is Decision.DID_NOT_HAPPEN:
        values["resolution"] = "person_did_not_happen"
    # Compare-and-set: only the first decision on an undecided action changes it.
    # Anyone may decide when the tool names no approvers.
    allowed = or_(
        func.jsonb_array_length(Action.approvers) == 0,
        Action.approvers.op("@>")(func.jsonb_build_array(by)),
    )
    if decision in (Decision.HAPPENED, Decision.DID_NOT_HAPPEN):
        allowed = true()
    # A finished run will never send an approved action, nor will one past its deadline
    # (the tick is about to end it): refuse rather than pretend.
    run_open = Action.run_id.in_(
        select(Run.id).where(
            Run.status.not_in(RunStatus.terminal()),
            or_(Run.deadline.is_(None), Run.deadline > func.now()),
        )
    )
    changed = session.execute(
        update(Action)
        .where(Action.idempotency_key == key, Action.state == required, allowed, run_open)
        .values(**values)
        .returning(Action.run_id)
    ).scalar_one_or_none()
    if changed is not None:
        log.info("action %s: %s by %s (%s)", key, decision, by, actor.via)
        audit_txn(session, key, changed, decision.value, actor, note)
        return DecisionResult(key, decision, by, True, new, changed)
    return _repeat_or_refuse(session, key, decision, required, by)


def audit_txn(
    session: Session,
    key: str,
    run_id: uuid.UUID,
    event: str,
    actor: Actor,
    note: str | None = None,
) -> None:
    """Append to the action's audit trail (in the transaction that made the change)."""
    session.add(
        ActionAudit(
            action_key=key, run_id=run_id, event=event, by=actor.identity, via=actor.via, note=note
        )
    )


def _repeat_or_refuse(
    session: Session, key: str, decision: Decision, required: ActionState, by: str
) -> DecisionResult:
    row = session.execute(
        select(
            Action.run_id, Action.state, Action.decision, Action.decided_by, Action.approvers
        ).where(Action.idempotency_key == key)
    ).one_or_none()
    if row is None:
        raise UnknownAction(f"no action has idempotency key {key!r}")
    run = session.execute(
        select(Run.status, Run.stop_reason, Run.deadline, Run.deadline <= func.now()).where(
            Run.id == row.run_id
        )
    ).one()
    if row.state is ActionState.WITHDRAWN:
        raise StatusConflict(
            f"action {key!r} was withdrawn: its run {row.run_id} ended ({run.stop_reason}) "
            "before anyone decided"
        )
    if row.decision is None and run.status in RunStatus.terminal():
        raise StatusConflict(
            f"action {key!r} belongs to run {row.run_id}, which is {run.status}: "
            "nothing would carry out a decision now"
        )
    if row.decision is None and run[3]:  # past the deadline
        raise StatusConflict(
            f"action {key!r} belongs to run {row.run_id}, whose deadline passed at "
            f"{run.deadline.isoformat()}: nothing would carry out a decision now"
        )
    if row.decision is None and row.state == required and by not in (row.approvers or [by]):
        # Never say who may: that tells a stranger whose credential to go after.
        raise NotAnApprover(
            f"{by!r} is not among the approvers of action {key!r} (the tool's approvers, or "
            "NIGHTSHIFT_APPROVERS_<TOOL> on the workers, say who is)"
        )
    if row.decision == decision.value:
        return DecisionResult(key, decision, row.decided_by or "", False, row.state, row.run_id)
    if row.decision is not None:
        raise DecisionConflict(
            f"action {key!r} was already decided ({row.decision} by {row.decided_by}); "
            f"{decision} refused"
        )
    raise StatusConflict(
        f"action {key!r} is {row.state}, so it cannot take {decision!s} (that needs {required})"
    )


def _wake(run_id: uuid.UUID, key: str) -> None:
    """Make the run runnable again if it waits on this action. A transaction of its own, after
    the decision's: the engine locks a run before its actions, and this must not invert that
    order. If this never runs, the tick finds the decided action and wakes the run."""
    with transaction() as session:
        wake_for_action_txn(session, run_id, key)
