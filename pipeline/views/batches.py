"""A batch's progress as an operator reads it: children done / running / waiting / failed,
the synthesis, and the approvals the night's work waits for."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from models import Action, ActionState, Batch, BatchStatus, Run, RunStatus, tokens_used
from pipeline.db import read_only
from pipeline.errors import UnknownBatch

# How each run status counts for an operator.
_COLUMN = {
    RunStatus.SUCCEEDED: "done",
    RunStatus.RUNNING: "running",
    RunStatus.WAITING: "waiting",
    RunStatus.NEEDS_ATTENTION: "waiting",
    RunStatus.FAILED: "failed",
    RunStatus.CANCELLED: "failed",
}


@dataclass
class Children:
    done: int = 0
    running: int = 0
    waiting: int = 0
    """Waiting for a timer, an approval or a person (needs_attention)."""
    failed: int = 0
    """Failed or cancelled (a budget stop, say)."""
    tokens: int = 0

    @property
    def total(self) -> int:
        return self.done + self.running + self.waiting + self.failed

    @property
    def finished(self) -> int:
        return self.done + self.failed


@dataclass(frozen=True)
class PendingApproval:
    key: str
    tool: str
    args: dict[str, Any]
    approvers: list[str]
    """Who may decide (empty: anyone authenticated)."""


@dataclass(frozen=True)
class BatchProgress:
    id: str
    name: str
    status: BatchStatus
    stop_reason: str | None
    token_cap: int | None
    created_at: datetime
    finished_at: datetime | None
    children: Children
    synthesis_run_id: uuid.UUID | None
    synthesis_status: RunStatus | None
    synthesis_waiting_on: str | None
    pending_approvals: list[PendingApproval] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        c = self.children
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status.value,
            "stop_reason": self.stop_reason,
            "token_cap": self.token_cap,
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "children": {**asdict(c), "total": c.total, "finished": c.finished},
            "synthesis": {
                "run_id": str(self.synthesis_run_id) if self.synthesis_run_id else None,
                "status": self.synthesis_status.value if self.synthesis_status else None,
                "waiting_on": self.synthesis_waiting_on,
            },
            # Not who the approvers are: the API and the page name them to no one who may not
            # decide (`nightshift batches` shows them to the operator).
            "pending_approvals": [
                {"key": a.key, "tool": a.tool, "args": a.args} for a in self.pending_approvals
            ],
        }


def show_batch(batch_id: str) -> BatchProgress:
    with read_only() as session:
        found = progress_txn(session, [batch_id])
    if not found:
        raise UnknownBatch(f"no batch has id {batch_id!r} (see `nightshift batches list`)")
    return found[0]


def list_batches(limit: int = 20) -> list[BatchProgress]:
    with read_only() as session:
        newest = select(Batch.id).order_by(Batch.created_at.desc(), Batch.id).limit(limit)
        return progress_txn(session, list(session.scalars(newest)))


def progress_txn(session: Session, batch_ids: Sequence[str]) -> list[BatchProgress]:
    """The batches' progress, in the order asked for; unknown ids are left out."""
    batches = {b.id: b for b in session.scalars(select(Batch).where(Batch.id.in_(batch_ids)))}
    children = _children_txn(session, batch_ids)
    synthesis_ids = [b.synthesis_run_id for b in batches.values() if b.synthesis_run_id]
    synthesis = {
        row.id: row
        for row in session.execute(
            select(Run.id, Run.status, Run.waiting_on).where(Run.id.in_(synthesis_ids))
        )
    }
    approvals = _pending_approvals_txn(session, batch_ids)
    found = []
    for batch_id in batch_ids:
        batch = batches.get(batch_id)
        if batch is None:
            continue
        run = synthesis.get(batch.synthesis_run_id) if batch.synthesis_run_id else None
        found.append(
            BatchProgress(
                id=batch.id,
                name=batch.name,
                status=batch.status,
                stop_reason=batch.stop_reason,
                token_cap=batch.token_cap,
                created_at=batch.created_at,
                finished_at=batch.finished_at,
                children=children.get(batch.id, Children()),
                synthesis_run_id=batch.synthesis_run_id,
                synthesis_status=run.status if run else None,
                synthesis_waiting_on=run.waiting_on if run else None,
                pending_approvals=approvals.get(batch.id, []),
            )
        )
    return found


def _children_txn(session: Session, batch_ids: Sequence[str]) -> dict[str, Children]:
    rows = session.execute(
        select(
            Run.batch_id,
            Run.status,
            func.count(),
            func.coalesce(func.sum(tokens_used()), 0),
        )
        .where(Run.batch_id.in_(batch_ids))
        .group_by(Run.batch_id, Run.status)
    )
    counted: dict[str, Children] = {}
    for batch_id, status, count, tokens in rows:
        children = counted.setdefault(str(batch_id), Children())
        column = _COLUMN[status]
        setattr(children, column, getattr(children, column) + count)
        children.tokens += int(tokens)
    return counted


def _pending_approvals_txn(
    session: Session, batch_ids: Sequence[str]
) -> dict[str, list[PendingApproval]]:
    """Actions waiting for a person's approval, by the batch whose child or synthesis asks."""
    owner = func.coalesce(Run.batch_id, Batch.id)
    rows = session.execute(
        select(owner, Action.idempotency_key, Action.tool, Action.args, Action.approvers)
        .join(Run, Run.id == Action.run_id)
        .outerjoin(Batch, Batch.synthesis_run_id == Run.id)
        .where(
            Action.state == ActionState.PENDING_APPROVAL,
            or_(Run.batch_id.in_(batch_ids), Batch.id.in_(batch_ids)),
        )
        .order_by(Action.created_at, Action.idempotency_key)
    )
    pending: dict[str, list[PendingApproval]] = {}
    for batch_id, key, tool, args, approvers in rows:
        pending.setdefault(batch_id, []).append(PendingApproval(key, tool, args, approvers or []))
    return pending


ITEM_FIELDS = 3
"""A child's label shows at most this many fields of its input, each cut to ITEM_VALUE_CHARS."""
ITEM_VALUE_CHARS = 40


def item_labels(batch_id: str, run_ids: Sequence[str]) -> dict[str, str]:
    """What each of these children is for, read from its input (its item): the short fields
    in which they differ (the ticket, the competitor, the team), else all of them, e.g.
    `competitor=acme`. A run id says nothing to a person watching a night."""
    ids = [uuid.UUID(run_id) for run_id in run_ids]
    with read_only() as session:
        rows = session.execute(
            select(Run.id, Run.input).where(Run.batch_id == batch_id, Run.id.in_(ids))
        ).all()
    scalars = {str(run_id): _scalar_fields(item, batch_id) for run_id, item in rows}
    varying = {
        name
        for fields in scalars.values()
        for name in fields
        if len({str(other.get(name)) for other in scalars.values()}) > 1
    }
    labels = {}
    for run_id, fields in scalars.items():
        shown = [name for name in fields if name in varying] or list(fields)
        labels[run_id] = " · ".join(f"{name}={_cut(fields[name])}" for name in shown[:ITEM_FIELDS])
    return labels


def _scalar_fields(item: Any, batch_id: str) -> dict[str, Any]:
    """The input's fields a label can show: strings, numbers and booleans, not the batch's own
    id (which children often carry)."""
    if not isinstance(item, dict):
        return {}
    return {
        str(name): value
        for name, value in item.items()
        if isinstance(value, str | int | float | bool) and value != batch_id
    }


def _cut(value: Any) -> str:
    text = str(value)
    return text if len(text) <= ITEM_VALUE_CHARS else text[: ITEM_VALUE_CHARS - 1] + "…"
