"""People's decisions about actions: approve or reject a pending one, resolve an unknown one.

Each is a compare-and-set on the action row: the first decision wins, an identical second one
returns the first outcome, a conflicting one is refused. The run is woken after the commit.
Who decides is an Actor the caller authenticated (a token, a proxy header, the operator CLI);
every decision is also appended to the action's audit trail with how it was authenticated.
An approval can name what it saw (the run and the arguments' hash): if the action has changed
since, it is refused rather than applied to something the approver never saw. An unknown
outcome can be settled after its run ended; a failed action can be retried.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import func, select
from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import Action, ActionState, Run, RunStatus
from pipeline.db import transaction
from pipeline.errors import DecisionConflict, NotAnApprover, StatusConflict, UnknownAction
from pipeline.logs import get_logger
from pipeline.runs.waits import wake_for_action_txn

log = get_logger("nightshift.decisions")


def not_an_approver(
    key: str, by: str, approvers: list[str] | tuple[str, ...] | None
) -> NotAnApprover | None:
    """The refusal of `by`'s decision on an action with these approvers (none: anyone)."""
    if by in (approvers or [by]):
        return None
    # Never say who may: that tells a stranger whose credential to go after.
    return NotAnApprover(
        f"{by!r} is not among the approvers of action {key!r} (the tool's approvers, or "
        "NIGHTSHIFT_APPROVERS_<TOOL> on the workers, say who is)"
    )


def shown_to(who: str, identity: str | None, approvers: list[str] | tuple[str, ...] | None) -> bool:
    """Whether `who` may be told `identity` acted on an action with these approvers: an approver's
    identity (who decided, who is named in the audit trail) is shown to approvers only; any
    other identity, and every identity of an action that names no approvers, to anyone."""
    named = approvers or []
    return identity not in named or who in named


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


@dataclass(frozen=True)
class Seen:
    """What the person deciding was shown: the decision applies only if the action still is."""

    run_id: uuid.UUID | None = None
    args_hash: str | None = None


# What each decision requires and produces (did_not_happen of an ended run: released).
_RULES: dict[Decision, tuple[ActionState, ActionState]] = {
    Decision.APPROVE: (ActionState.PENDING_APPROVAL, ActionState.INTENDED),
    Decision.REJECT: (ActionState.PENDING_APPROVAL, ActionState.REJECTED),
    Decision.HAPPENED: (ActionState.OUTCOME_UNKNOWN, ActionState.CONFIRMED),
    Decision.DID_NOT_HAPPEN: (ActionState.OUTCOME_UNKNOWN, ActionState.INTENDED),
}


def decide(
    key: str,
    decision: Decision | str,
    actor: Actor,
    note: str | None = None,
    seen: Seen | None = None,
) -> DecisionResult:
    """Record a person's decision once and wake the run that waits for it."""
    decision = Decision(decision)
    with transaction() as session:
        result = decide_txn(session, key, decision, actor, note, seen)
    if result.first:
        wake_after_decision(result.action_key)
    return result


def decide_txn(
    session: Session,
    key: str,
    decision: Decision,
    actor: Actor,
    note: str | None,
    seen: Seen | None = None,
) -> DecisionResult:
    by = actor.identity
    required, new = _RULES[decision]
    result = resolution = None
    if decision is Decision.HAPPENED:
        result = statements.jsonb({"resolved_by": by, "note": note, "happened": True})
        resolution = "person_happened"
    elif decision is Decision.DID_NOT_HAPPEN:
        resolution = "person_did_not_happen"
    # Compare-and-set: only the first decision on an undecided action changes it.
    changed = statements.first(
        session,
        "decide_action",
        key=key,
        decision=decision.value,
        required=required.value,
        new=new.value,
        fact=decision in (Decision.HAPPENED, Decision.DID_NOT_HAPPEN),
        by=by,
        note=note,
        result=result,
        resolution=resolution,
        seen_run_id=seen.run_id if seen is not None else None,
        seen_args_hash=seen.args_hash if seen is not None else None,
    )
    if changed is not None:
        log.info("action %s: %s by %s (%s)", key, decision, by, actor.via)
        audit_txn(session, key, changed.run_id, decision.value, actor, note, changed.args_hash)
        return DecisionResult(key, decision, by, True, ActionState(changed.state), changed.run_id)
    return _repeat_or_refuse(session, key, decision, required, by, seen)


def audit_txn(
    session: Session,
    key: str,
    run_id: uuid.UUID,
    event: str,
    actor: Actor,
    note: str | None = None,
    args_hash: str | None = None,
) -> None:
    """Append to the action's audit trail (in the transaction that made the change)."""
    statements.execute(
        session, "audit_action", key=key, run_id=run_id, event=event, by=actor.identity,
        via=actor.via, note=note, args_hash=args_hash,
    )  # fmt: skip


def _repeat_or_refuse(
    session: Session,
    key: str,
    decision: Decision,
    required: ActionState,
    by: str,
    seen: Seen | None,
) -> DecisionResult:
    row = session.execute(
        select(
            Action.run_id,
            Action.state,
            Action.decision,
            Action.decided_by,
            Action.approvers,
            Action.args_hash,
        ).where(Action.idempotency_key == key)
    ).one_or_none()
    if row is None:
        raise UnknownAction(f"no action has idempotency key {key!r}")
    if seen is not None and (
        (seen.run_id is not None and seen.run_id != row.run_id)
        or (seen.args_hash is not None and seen.args_hash != row.args_hash)
    ):
        raise DecisionConflict(
            f"action {key!r} is not the one you saw: it now belongs to run {row.run_id} "
            "or has other arguments; look at it again before deciding"
        )
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
    approving = decision in (Decision.APPROVE, Decision.REJECT)
    undecided = approving and row.decision is None
    if undecided and run.status in RunStatus.terminal():
        raise StatusConflict(
            f"action {key!r} belongs to run {row.run_id}, which is {run.status}: "
            "nothing would carry out a decision now"
        )
    if undecided and run[3]:  # past the deadline
        raise StatusConflict(
            f"action {key!r} belongs to run {row.run_id}, whose deadline passed at "
            f"{run.deadline.isoformat()}: nothing would carry out a decision now"
        )
    # Approving or rejecting is an approver's, decided or not: a stranger learns neither the
    # first outcome nor who gave it.
    refused = not_an_approver(key, by, row.approvers) if approving else None
    if refused is not None:
        raise refused
    if row.decision == decision.value:
        return DecisionResult(key, decision, row.decided_by or "", False, row.state, row.run_id)
    if row.decision is not None:
        decider = row.decided_by if shown_to(by, row.decided_by, row.approvers) else None
        raise DecisionConflict(
            f"action {key!r} was already decided ({row.decision}"
            f"{f' by {decider}' if decider else ''}); {decision} refused"
        )
    raise StatusConflict(
        f"action {key!r} is {row.state}, so it cannot take {decision!s} (that needs {required})"
    )


def wake_after_decision(key: str) -> None:
    """Make runs waiting on this action runnable again (its own, and any waiting for its key).
    A transaction of its own, after the decision's: the engine locks a run before its actions,
    and this must not invert that order. If this never runs, the tick finds the settled action
    and wakes the runs."""
    with transaction() as session:
        wake_for_action_txn(session, key)


@dataclass(frozen=True)
class RetryResult:
    action_key: str
    run_id: uuid.UUID
    """The run whose failure this was; the next run meaning the action takes the key over."""
    error: str | None
    """The failure that was recorded, now no longer replayed."""


def retry(key: str, actor: Actor, note: str | None = None) -> RetryResult:
    """Stop replaying a failed action's stored failure: the key is released, and the next run
    that means the action (its own run, if it calls again, or a rerun) does it afresh."""
    with transaction() as session:
        row = statements.first(session, "release_failed_action", key=key)
        if row is None:
            state = session.scalar(select(Action.state).where(Action.idempotency_key == key))
            if state is None:
                raise UnknownAction(f"no action has idempotency key {key!r}")
            raise StatusConflict(f"action {key!r} is {state}; only a failed action can be retried")
        audit_txn(session, key, row.run_id, "retry", actor, note or row.error, row.args_hash)
    log.info("action %s: retried by %s (%s); its key is released", key, actor.identity, actor.via)
    wake_after_decision(key)
    return RetryResult(key, row.run_id, row.error)
