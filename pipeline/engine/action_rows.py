"""The actions table as the action protocol uses it: record a key before the first send, read
an action with its owner, and change its state only for the run that owns it.

Every state change names the owning run, so a run whose key was released and taken over by
another can no longer move it, and no run moves another run's action.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

import pipeline.instruments as instruments
import pipeline.statements as statements
from models import Action, ActionKind, ActionState, Run, RunStatus
from pipeline.db import after_commit
from pipeline.engine.dispatch import COUNTED, NewAction, cap_refusal
from pipeline.engine.leases import Lease, fenced
from pipeline.errors import StatusConflict
from pipeline.keys import forked_from
from pipeline.runs.obligations import NIGHTSHIFT
from pipeline.tools import ToolOutput


def arguments_hash(args: dict[str, Any]) -> str:
    """SHA-256 of the arguments' canonical JSON: the same arguments always hash the same."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class ActionView:
    key: str
    state: ActionState
    run_id: uuid.UUID
    """The run that owns the action: the only one that may send it or wait for its decision."""
    run_status: RunStatus
    tool: str
    service: str
    args: dict[str, Any]
    """As recorded: what the approver saw and what is sent."""
    args_hash: str | None
    requires_approval: bool
    attempts: int
    first_attempt_at: datetime | None
    updated_at: datetime
    result: dict[str, Any] | None
    error: str | None
    decided_by: str | None
    note: str | None
    now: datetime


_FREE = (ActionState.RELEASED, ActionState.WITHDRAWN)
"""Keys no run holds: the next run that means the action takes them over."""


def is_new_txn(session: Session, key: str) -> bool:
    """Whether recording `key` would make a new action: no row has it, or none that a run
    holds. Not new: this run recorded it before (a replayed or crashed step), or another run
    did (this run learns its outcome, it does not send it)."""
    state = session.execute(
        select(Action.state).where(Action.idempotency_key == key)
    ).scalar_one_or_none()
    return state is None or state in _FREE


def is_new(lease: Lease, key: str) -> bool:
    with fenced(lease) as session:
        return is_new_txn(session, key)


def check_cap_txn(session: Session, new: NewAction) -> None:
    """PermanentError if recording `new` would give its run more actions of the service than
    its cap. Only a new action counts: one this run recorded before was let through then, and
    another run's action is not this run's send."""
    if new.cap is None or not is_new_txn(session, new.key):
        return
    used: int = session.execute(
        select(func.count())
        .select_from(Action)
        .where(
            Action.run_id == new.run_id,
            Action.kind == ActionKind.TOOL,  # a webhook about the run is none of its sends
            Action.service == new.service,
            Action.idempotency_key != new.key,
            Action.state.in_(COUNTED),
        )
    ).scalar_one()
    refused = cap_refusal(new, used)
    if refused is not None:
        raise refused


def record_txn(session: Session, new: NewAction) -> ActionView:
    """Save the key before anything is sent. An existing row is left as it is, unless it was
    released or withdrawn: then this run takes the key over, afresh (its own arguments, its own
    approval); or it is the open action (outcome unknown) of a run this one was forked from
    (its origin, or that one's): then this run carries it on as it stands. Refused
    (PermanentError) past the run's cap for the service."""
    check_cap_txn(session, new)
    values = {
        "key": new.key,
        "kind": ActionKind.TOOL,
        "run_id": new.run_id,
        "batch_id": None,
        "tool_use_id": new.tool_use_id,
        "tool": new.tool,
        "service": new.service,
        "args": statements.jsonb(new.args),
        "args_hash": arguments_hash(new.args),
        "state": new.first_state,
        "requires_approval": new.requires_approval,
        "approvers": statements.jsonb(list(new.approvers)),
    }
    recorded = statements.first(session, "record_action", id=uuid.uuid4(), **values)
    if recorded is None:  # released or withdrawn: this run takes it over
        recorded = statements.first(session, "take_over_action", **values)
    forked_from_runs = [] if recorded is not None else origins_txn(session, new.run_id)
    if forked_from_runs:  # a fork: what its origins left open, it reconciles
        statements.first(
            session, "take_over_from_origin", key=new.key, run_id=new.run_id,
            tool_use_id=new.tool_use_id, origins=forked_from_runs, by=NIGHTSHIFT,
            via="the run it was forked from ended",
        )  # fmt: skip
    if recorded is not None:
        after_commit(session, instruments.ACTIONS.labels(new.first_state.value).inc)
    return view_txn(session, new.key)


MAX_FORK_CHAIN = 20
"""How many runs back a fork's origins are followed (a fork of a fork of ...)."""


def origins_txn(session: Session, run_id: uuid.UUID) -> list[uuid.UUID]:
    """The runs this run was forked from: its origin, that one's origin, and so on (each
    named by its fork's key, which only pipeline/runs/fork.py gives). Empty for no fork."""
    chain: list[uuid.UUID] = []
    current = run_id
    while len(chain) < MAX_FORK_CHAIN:
        key = session.execute(
            select(Run.idempotency_key).where(Run.id == current)
        ).scalar_one_or_none()
        origin = forked_from(key)
        if origin is None:
            break
        chain.append(origin.run_id)
        current = origin.run_id
    return chain


def origins(lease: Lease) -> list[uuid.UUID]:
    with fenced(lease) as session:
        return origins_txn(session, lease.run_id)


def of_call(lease: Lease, tool_use_id: str) -> ActionView | None:
    """The action this run already recorded for this tool call, whatever its key: a replayed
    call is settled through it, even when today's code would compute another key."""
    with fenced(lease) as session:
        key = session.execute(
            select(Action.idempotency_key)
            .where(Action.run_id == lease.run_id, Action.tool_use_id == tool_use_id)
            .order_by(Action.created_at)  # the first, if an older release recorded a second
            .limit(1)
        ).scalar_one_or_none()
        return None if key is None else view_txn(session, key)


def load(lease: Lease, key: str) -> ActionView:
    with fenced(lease) as session:
        return view_txn(session, key)


def view_txn(session: Session, key: str) -> ActionView:
    action, run_status, now = session.execute(
        select(Action, Run.status, func.now())
        .join(Run, Run.id == Action.run_id)
        .where(Action.idempotency_key == key)
    ).one()
    assert action.run_id is not None, f"action {key!r}: joined to its run, it has one"
    return ActionView(
        key=key,
        state=action.state,
        run_id=action.run_id,
        run_status=run_status,
        tool=action.tool,
        service=action.service,
        args=action.args,
        args_hash=action.args_hash,
        requires_approval=action.requires_approval,
        attempts=action.attempts,
        first_attempt_at=action.first_attempt_at,
        updated_at=action.updated_at,
        result=action.result,
        error=action.error,
        decided_by=action.decided_by,
        note=action.note,
        now=now,
    )


def set_state_txn(
    session: Session,
    run_id: uuid.UUID,
    key: str,
    new: ActionState,
    *,
    attempted: bool = False,
    error: str | None = None,
    resolution: str | None = None,
) -> None:
    """Move this run's action to `new`; StatusConflict if it is not this run's, or not in a
    state that can become `new`."""
    changed = statements.execute(
        session, "action_state", key=key, run_id=run_id, state=new,
        sources=list(ActionState.sources_of(new)), attempted=attempted, error=error,
        resolution=resolution, fence=None, args=None,  # the run's fence guards this transaction
    )  # fmt: skip
    _changed(session, key, new, changed)


def _changed(session: Session, key: str, new: ActionState, changed: int) -> None:
    if not changed:
        raise StatusConflict(
            f"action {key!r} cannot become {new}: it is not this run's, or not in a state that can"
        )
    after_commit(session, instruments.ACTIONS.labels(new.value).inc)


def transition(lease: Lease, key: str, new: ActionState, resolution: str | None) -> None:
    with fenced(lease) as session:
        set_state_txn(session, lease.run_id, key, new, resolution=resolution)


def confirm_txn(
    session: Session, run_id: uuid.UUID, key: str, result: dict[str, Any], resolution: str | None
) -> None:
    confirmed = ActionState.CONFIRMED
    changed = statements.execute(
        session, "confirm_action", key=key, run_id=run_id, result=statements.jsonb(result),
        resolution=resolution, sources=list(ActionState.sources_of(confirmed)), fence=None,
    )  # fmt: skip
    _changed(session, key, confirmed, changed)


def confirm(lease: Lease, key: str, result: ToolOutput, resolution: str) -> None:
    with fenced(lease) as session:
        confirm_txn(session, lease.run_id, key, as_result(result), resolution)


def as_result(output: ToolOutput) -> dict[str, Any]:
    return output if isinstance(output, dict) else {"text": str(output)}


def set_lease_txn(session: Session, lease: Lease, seconds: float) -> None:
    """The lease ends `seconds` from now: a send's window before it (committed, so that a
    takeover waits for the send even if this session ends), one lease again after it."""
    statements.execute(
        session, "set_lease", run_id=lease.run_id, fence=lease.fence, seconds=seconds
    )


def hold_run_during_send_txn(session: Session, window_seconds: float) -> None:
    """Keep the run's row locked for the send (a takeover waits for the reply), and let
    PostgreSQL end this session should it stay idle past the send's window (a frozen process
    then keeps no row locked past its lease)."""
    milliseconds = str(int(window_seconds * 1000))
    statements.first(session, "hold_run_during_send", milliseconds=milliseconds)
