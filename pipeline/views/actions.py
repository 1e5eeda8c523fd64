"""Read models the status page adds to pipeline.queries and pipeline.batches: one action."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from models import Action
from pipeline.db import transaction
from pipeline.runs.decisions import UnknownAction
from pipeline.views.runs import _plain

ACTION_FIELDS = (
    "idempotency_key", "run_id", "tool", "service", "args", "state", "attempts", "resolution",
    "result", "error", "requires_approval", "approvers", "decision", "decided_by", "decided_at",
    "note", "first_attempt_at", "last_attempt_at", "created_at", "updated_at",
)  # fmt: skip


def show_action(key: str) -> dict[str, Any]:
    """One action as a person deciding about it needs to see it."""
    with transaction() as session:
        action = session.scalar(select(Action).where(Action.idempotency_key == key))
        if action is None:
            raise UnknownAction(f"no action has idempotency key {key!r}")
        shown = {name: _plain(getattr(action, name)) for name in ACTION_FIELDS}
        return shown | {"state": action.state.value}
