"""Bulk operations as people follow them: who asked for what, by which filter, and how far it
got (items done of all, and what each came to)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import BulkItem, BulkOperation
from pipeline.db import read_only
from pipeline.errors import UnknownBulkOperation

ITEMS_SHOWN = 500
"""The items an operation's page lists (its counts are always whole)."""


def parse_operation_id(text: str) -> uuid.UUID:
    """An operation's id as given (a path, the command line); not an id: none has it."""
    try:
        return uuid.UUID(text)
    except ValueError:
        raise UnknownBulkOperation(f"no bulk operation has id {text[:40]!r}") from None


def bulk_operation(operation_id: uuid.UUID, *, items: bool = True) -> dict[str, Any]:
    """One operation with its progress and (up to ITEMS_SHOWN of) its items."""
    with read_only() as session:
        operation = session.get(BulkOperation, operation_id)
        if operation is None:
            raise UnknownBulkOperation(f"no bulk operation has id {operation_id}")
        shown = _summary(session, operation)
        if items:
            rows = session.scalars(
                select(BulkItem)
                .where(BulkItem.operation_id == operation_id)
                .order_by(BulkItem.position)
                .limit(ITEMS_SHOWN)
            )
            shown["items"] = [
                {
                    "run_id": str(item.run_id),
                    "action_key": item.action_key,
                    "done": item.done_at is not None,
                    "outcome": item.outcome,
                    "detail": item.detail,
                }
                for item in rows
            ]
        return shown


def recent_bulk_operations(limit: int = 20) -> list[dict[str, Any]]:
    """The newest operations first, with their progress."""
    with read_only() as session:
        operations = session.scalars(
            select(BulkOperation).order_by(BulkOperation.created_at.desc()).limit(limit)
        ).all()
        return [_summary(session, operation) for operation in operations]


def _summary(session: Session, operation: BulkOperation) -> dict[str, Any]:
    outcomes = dict(
        session.execute(
            select(BulkItem.outcome, func.count())
            .where(BulkItem.operation_id == operation.id, BulkItem.done_at.is_not(None))
            .group_by(BulkItem.outcome)
        ).all()
    )
    done = sum(outcomes.values())
    return {
        "id": str(operation.id),
        "kind": operation.kind.value,
        "filter": operation.filter,
        "requested_by": operation.requested_by,
        "via": operation.via,
        "note": operation.note,
        "created_at": operation.created_at.isoformat(),
        "finished_at": operation.finished_at.isoformat() if operation.finished_at else None,
        "total": operation.total,
        "done": done,
        "outcomes": {str(outcome): count for outcome, count in outcomes.items()},
    }
