"""Side effects exactly once: the action journal, idempotency keys and reconciliation.

intended -> attempted -> confirmed; an attempt with no saved reply is outcome_unknown and is
resolved by resending with the same key (only inside the service's key-retention window),
else by asking the service (lookup), else by a person (the run waits in needs_attention).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

import pipeline.instruments as instruments
from models import Action, ActionState, RunStatus
from pipeline.crash import crash_point
from pipeline.db import after_commit
from pipeline.engine.leases import Lease, fenced
from pipeline.errors import (
    LookupUnsupported,
    NightshiftError,
    PermanentError,
    StatusConflict,
    StopStep,
    redact_urls,
)
from pipeline.keys import Wait, approval_wait, check_key, person_wait, retry_wait
from pipeline.logs import get_logger
from pipeline.retry import RetryPolicy, classify
from pipeline.settings import Settings
from pipeline.tools import SideEffect, Tool, ToolContext, ToolOutput, once_scope

if TYPE_CHECKING:
    from pipeline.engine.toolcalls import ToolCall

log = get_logger("nightshift.actions")

RESEND_POLICY = RetryPolicy(attempts=3, base_seconds=0.5, cap_seconds=5.0)


class ParkRun(StopStep):
    """Stop this step and park the run until a person, an approval or a timer moves it on."""

    def __init__(self, status: RunStatus, wait: Wait, wake_at: datetime | None = None):
        super().__init__(f"parking run as {status} on {wait}")
        self.status = status
        self.waiting_on = str(wait)
        self.wake_at = wake_at


@dataclass(frozen=True)
class ActionView:
    key: str
    args: dict[str, Any]
    """As saved before the first send: a lookup asks the service about these."""
    state: ActionState
    attempts: int
    first_attempt_at: datetime | None
    result: dict[str, Any] | None
    error: str | None
    decided_by: str | None
    note: str | None
    now: datetime


def perform(tool: Tool, call: ToolCall, context: ToolContext) -> ToolOutput:
    """Run a side-effecting tool call so that its effect happens at most once."""
    effect = tool.side_effect
    assert effect is not None, f"{tool.name} has no side effect declared"
    args = call.block["input"]
    try:
        key = check_key(tool.action_key(args, context), what=f"{tool.name}'s idempotency key")
    except NightshiftError as exc:
        raise PermanentError(str(exc)) from None
    keyed = replace(context, idempotency_key=key)
    action = _ensure_recorded(call, tool, effect, key, args, context.settings)
    crash_point("after_intended")
    for resend in range(RESEND_POLICY.attempts + 1):
        context.keep_going()
        outcome = _next_move(call, tool, keyed, action, resend)
        if outcome is not None:
            return outcome
        action = _load(call.lease, key)
    if action.state is ActionState.INTENDED:
        # The last resend never went out: nothing is unknown, the service is down. A person
        # could not resolve this (their decisions need outcome_unknown): try again later.
        # Nothing in flight: the run waits on a durable timer (no process held), then tries again.
        later = timedelta(seconds=context.settings.service_retry_seconds)
        log.warning("action %s: the service kept failing; trying again in %s", key, later)
        raise ParkRun(RunStatus.WAITING, retry_wait(key), wake_at=action.now + later)
    _park_for_person(call.lease, key, "the service kept failing; the outcome is unknown")
    raise AssertionError("unreachable: parking raises")


def record_proposal(tool: Tool, call: ToolCall, context: ToolContext) -> None:
    """Record an approval-requiring call as pending without sending anything, so a person sees
    every proposal of a model reply at once rather than one per replay of the step."""
    effect = tool.side_effect
    assert effect is not None and tool.requires_approval, f"{tool.name} needs no approval"
    try:
        key = check_key(tool.action_key(call.block["input"], context), what="idempotency key")
    except NightshiftError:
        return  # perform() reports it to the model when this call's turn comes
    _ensure_recorded(call, tool, effect, key, call.block["input"], context.settings)


def _next_move(
    call: ToolCall, tool: Tool, context: ToolContext, action: ActionView, resend: int
) -> ToolOutput | None:
    """Act on the action's state; None means: state changed, look again."""
    key = action.key
    if action.state is ActionState.CONFIRMED:
        return action.result or {}
    if action.state is ActionState.FAILED:
        raise PermanentError(action.error or "the service refused this action")
    if action.state is ActionState.REJECTED:
        who = action.decided_by or "a person"
        return f"Not done: {who} rejected this action ({action.note or 'no reason given'})."
    if action.state is ActionState.WITHDRAWN:
        return "Not done: the approval was withdrawn because the run ended before a decision."
    if action.state is ActionState.PENDING_APPROVAL:
        raise ParkRun(RunStatus.WAITING, approval_wait(key))
    if action.state is ActionState.ATTEMPTED:
        # An attempt whose reply was never saved: it may or may not have happened.
        _transition(call.lease, key, ActionState.OUTCOME_UNKNOWN, resolution=None)
        return None
    if action.state is ActionState.OUTCOME_UNKNOWN:
        return _reconcile(call, tool, context, action, resend)
    return _send(call, tool, context, action)


def _reconcile(
    call: ToolCall, tool: Tool, context: ToolContext, action: ActionView, resend: int
) -> ToolOutput | None:
    key = action.key
    effect = tool.side_effect
    assert effect is not None
    if resend:
        time.sleep(RESEND_POLICY.delay(resend))  # the service just failed us: back off
    retention = effect.retention(context.settings)
    if effect.honoured(context.settings) and _inside_retention(retention, action):
        log.info("action %s: outcome unknown; resending with the same key", key)
        _transition(call.lease, key, ActionState.INTENDED, resolution="resent_with_key")
        return None
    if effect.lookup is not None:
        try:
            found = tool.look_up(key, action.args, context)
        except LookupUnsupported:
            found = None
            supported = False
        except Exception as exc:
            if isinstance(classify(exc), PermanentError):
                raise
            why = context.settings.config.redact(str(exc))
            log.warning("action %s: lookup failed (%s); will try again", key, why)
            return None
        else:
            supported = True
        if supported and found is not None:
            log.info("action %s: lookup says it happened; confirming without resending", key)
            _confirm(call.lease, key, found, resolution="lookup")
            return None
        if supported:
            log.info("action %s: lookup says it did not happen; sending with the same key", key)
            _transition(call.lease, key, ActionState.INTENDED, resolution="lookup_not_found")
            return None
    _park_for_person(call.lease, key, "no reply was saved and the service cannot tell")
    return None


def _inside_retention(retention: timedelta | None, action: ActionView) -> bool:
    if retention is None:
        return False  # the service says for how long it keeps keys, or it is not trusted
    if action.first_attempt_at is None:
        return True  # nothing sent yet
    return action.now - action.first_attempt_at < retention  # no overflow for timedelta.max


def _send(
    call: ToolCall, tool: Tool, context: ToolContext, action: ActionView
) -> ToolOutput | None:
    key = action.key
    with fenced(call.lease) as session:
        _set_state_txn(session, key, ActionState.ATTEMPTED, attempted=True)
    crash_point("after_attempted")
    try:
        # The run row stays locked during the send: a worker taking over waits for the reply
        # (or for PostgreSQL to end this session if this process freezes) before reconciling.
        with fenced(call.lease) as session:
            _hold_run_during_send_txn(session, call.lease, context.settings.lease_seconds)
            with once_scope(None):  # the send happens once already: once() is refused here
                result = tool.run(call.block["input"], context)
            crash_point("after_send_before_reply")
            _confirm_txn(session, key, _as_result(result), resolution=None)
    except (StopStep, KeyboardInterrupt, DBAPIError):
        raise  # the reply was not saved: the next step finds `attempted` and reconciles
    except Exception as exc:
        error = classify(exc)
        if isinstance(error, PermanentError):
            with fenced(call.lease) as session:
                failed = context.settings.config.redact(redact_urls(str(error)))
                _set_state_txn(session, key, ActionState.FAILED, error=failed)
            raise error from exc
        why = context.settings.config.redact(str(error))
        log.warning("action %s: send failed, outcome unknown: %s", key, why)
        _transition(call.lease, key, ActionState.OUTCOME_UNKNOWN, resolution=None)
        return None
    crash_point("after_confirmed")
    return result


def _as_result(output: ToolOutput) -> dict[str, Any]:
    return output if isinstance(output, dict) else {"text": str(output)}


# -- database --------------------------------------------------------------------------------


def _ensure_recorded(
    call: ToolCall,
    tool: Tool,
    effect: SideEffect,
    key: str,
    args: dict[str, Any],
    settings: Settings,
) -> ActionView:
    """Save the key before anything is sent; an existing row (same meaning) is reused."""
    state = ActionState.PENDING_APPROVAL if tool.requires_approval else ActionState.INTENDED
    with fenced(call.lease) as session:
        inserted = session.execute(
            insert(Action)
            .values(
                idempotency_key=key,
                run_id=call.run_id,
                tool_use_id=call.block["id"],
                tool=tool.name,
                service=effect.service,
                args=args,
                state=state,
                requires_approval=tool.requires_approval,
                approvers=list(settings.approvers_for(tool.name, tool.approvers)),
            )
            .on_conflict_do_nothing(index_elements=["idempotency_key"])
        ).rowcount  # type: ignore[attr-defined]
        if inserted:
            after_commit(session, instruments.ACTIONS.labels(state.value).inc)
        return _view_txn(session, key)


def _load(lease: Lease, key: str) -> ActionView:
    with fenced(lease) as session:
        return _view_txn(session, key)


def _view_txn(session: Session, key: str) -> ActionView:
    row = session.execute(select(Action, func.now()).where(Action.idempotency_key == key)).one()
    action, now = row
    return ActionView(
        key=key,
        args=action.args,
        state=action.state,
        attempts=action.attempts,
        first_attempt_at=action.first_attempt_at,
        result=action.result,
        error=action.error,
        decided_by=action.decided_by,
        note=action.note,
        now=now,
    )


def _set_state_txn(
    session: Session,
    key: str,
    new: ActionState,
    *,
    attempted: bool = False,
    error: str | None = None,
    resolution: str | None = None,
) -> None:
    values: dict[str, Any] = {"state": new}
    if attempted:
        values |= {
            "attempts": Action.attempts + 1,
            "first_attempt_at": func.coalesce(Action.first_attempt_at, func.now()),
            "last_attempt_at": func.now(),
        }
    if error is not None:
        values["error"] = error
    if resolution is not None:
        values["resolution"] = resolution
    changed = session.execute(
        update(Action)
        .where(Action.idempotency_key == key, Action.state.in_(ActionState.sources_of(new)))
        .values(**values)
    ).rowcount  # type: ignore[attr-defined]
    if not changed:
        raise StatusConflict(f"action {key!r} cannot become {new} from its current state")
    after_commit(session, instruments.ACTIONS.labels(new.value).inc)


def _transition(lease: Lease, key: str, new: ActionState, resolution: str | None) -> None:
    with fenced(lease) as session:
        _set_state_txn(session, key, new, resolution=resolution)


def _confirm_txn(
    session: Session, key: str, result: dict[str, Any], resolution: str | None
) -> None:
    _set_state_txn(session, key, ActionState.CONFIRMED, resolution=resolution)
    session.execute(update(Action).where(Action.idempotency_key == key).values(result=result))


def _confirm(lease: Lease, key: str, result: ToolOutput, resolution: str) -> None:
    with fenced(lease) as session:
        _confirm_txn(session, key, _as_result(result), resolution)


def _hold_run_during_send_txn(session: Session, lease: Lease, lease_seconds: float) -> None:
    """Extend the lease for the send and let PostgreSQL end this session if it stalls."""
    timeout_ms = int(lease_seconds * 1000)
    session.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {timeout_ms}"))
    session.execute(
        text(
            "UPDATE runs SET lease_expires_at = now() + make_interval(secs => :secs) "
            "WHERE id = :run_id AND fence = :fence"
        ),
        {"secs": lease_seconds * 2, "run_id": lease.run_id, "fence": lease.fence},
    )


def _park_for_person(lease: Lease, key: str, why: str) -> None:
    log.warning("action %s: %s; the run waits for a person (nightshift actions resolve)", key, why)
    raise ParkRun(RunStatus.NEEDS_ATTENTION, person_wait(key))
