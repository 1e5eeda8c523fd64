"""Actions as people read them: lists by state, and one action to decide about."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from models import Action, ActionAudit, ActionKind, ActionState
from pipeline.db import read_only
from pipeline.errors import UnknownAction
from pipeline.views.runs import plain

ACTION_FIELDS = (
    "idempotency_key", "run_id", "tool", "service", "args", "args_hash", "state", "attempts",
    "resolution",
    "result", "error", "requires_approval", "approvers", "decision", "decided_by", "decided_at",
    "note", "first_attempt_at", "last_attempt_at", "created_at", "updated_at",
)  # fmt: skip
AUDIT_FIELDS = ("created_at", "event", "by", "via", "note", "run_id", "args_hash")


ATTENTION = (ActionState.PENDING_APPROVAL, ActionState.OUTCOME_UNKNOWN)
"""The states in which an action waits for a person."""


def count_actions(states: tuple[ActionState, ...]) -> int:
    """Actions in these states (an index scan on state)."""
    with read_only() as session:
        counted = session.scalar(
            select(func.count())
            .select_from(Action)
            .where(Action.state.in_(states), Action.kind == ActionKind.TOOL)
        )
    return int(counted or 0)


def show_action(key: str) -> dict[str, Any]:
    """One action as a person deciding about it needs to see it."""
    with read_only() as session:
        action = session.scalar(select(Action).where(Action.idempotency_key == key))
        if action is None:
            raise UnknownAction(f"no action has idempotency key {key!r}")
        shown = {name: plain(getattr(action, name)) for name in ACTION_FIELDS}
        audit = session.scalars(
            select(ActionAudit).where(ActionAudit.action_key == key).order_by(ActionAudit.id)
        )
        trail = [{name: plain(getattr(entry, name)) for name in AUDIT_FIELDS} for entry in audit]
        return shown | {"state": action.state.value, "audit": trail}


def list_actions(state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    query = (
        select(Action)
        .where(Action.kind == ActionKind.TOOL)  # a webhook is no person's to decide
        .order_by(Action.created_at.desc())
        .limit(limit)
    )
    if state:
        query = query.where(Action.state == ActionState(state))
    with read_only() as session:
        return [
            {
                "idempotency_key": a.idempotency_key,
                "run_id": str(a.run_id),
                "tool": a.tool,
                "service": a.service,
                "state": a.state.value,
                "attempts": a.attempts,
                "resolution": a.resolution,
                "decision": a.decision,
                "decided_by": a.decided_by,
                "args": a.args,
                "args_hash": a.args_hash,
                "approvers": a.approvers,
                "updated_at": a.updated_at.isoformat(),
            }
            for a in session.scalars(query)
        ]
