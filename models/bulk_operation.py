"""Bulk operations: one audited, durable operation on every run (or pending approval) a filter
matched when it was created; its items are frozen then and each is done once."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import ForeignKey, Index, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column, status_column


class BulkKind(StrEnum):
    CANCEL = "cancel"
    """Cancel each matched run that has not ended, as `POST /runs/{id}/cancel` does."""
    RETRY = "retry"
    """Retry each matched failed run, as `POST /runs/{id}/retry` does (once per run)."""
    APPROVE = "approve"
    """Approve each pending approval of the matched runs, as an approver's decision does."""
    REJECT = "reject"
    """Reject each pending approval of the matched runs."""

    def on_actions(self) -> bool:
        """Whether its items are pending approvals (an action each) rather than runs."""
        return self in (BulkKind.APPROVE, BulkKind.REJECT)


class BulkOperation(Base):
    __tablename__ = "bulk_operations"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    kind: Mapped[BulkKind] = mapped_column(status_column(BulkKind, "bulk_kind"))
    filter: Mapped[dict[str, Any]]
    """The filter as given (agent, batch, status, stop_reason, started_after, started_before,
    waiting_on): what the items were matched by, for the audit."""
    requested_by: Mapped[str] = mapped_column(String(200))
    via: Mapped[str] = mapped_column(String(200))
    """How the requester was authenticated, as an action's audit trail says it."""
    note: Mapped[str | None] = mapped_column(Text)
    """The reason given (a cancellation's reason, a decision's note)."""
    total: Mapped[int]
    lease_expires_at: Mapped[datetime | None]
    """Until when the worker processing it is believed alive; the tick re-sends the operation
    once this passed and it is not finished."""
    created_at: Mapped[datetime] = created_at_column()
    finished_at: Mapped[datetime | None]

    __table_args__ = (
        Index(
            "ix_bulk_operations_unfinished",
            "lease_expires_at",
            postgresql_where=text("finished_at IS NULL"),
        ),
        Index("ix_bulk_operations_created_at", "created_at"),
    )


class BulkItem(Base):
    """One run (or pending approval) of an operation. `done_at` is set in the transaction
    that applies it, so an item is applied once, or not at all when that transaction dies."""

    __tablename__ = "bulk_items"

    operation_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("bulk_operations.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[uuid.UUID]
    """No foreign key: the record of what was matched outlives a run retention deletes."""
    action_key: Mapped[str | None] = mapped_column(String(200))
    """The pending approval decided (approve, reject); null for the operations on runs."""
    done_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(String(32))
    """done (the effect happened), already (it had happened before: a run already ended or
    retried, an identical decision) or refused (not applicable: detail says why)."""
    detail: Mapped[str | None] = mapped_column(Text)
    """What happened: the retry's run id, the run's status, the refusal's reason."""
