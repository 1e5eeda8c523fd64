"""One row per side effect: the idempotency key is saved before the first send."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column, status_column, updated_at_column
from models.status import ActionState


class Action(Base):
    __tablename__ = "actions"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    idempotency_key: Mapped[str] = mapped_column(String(200), unique=True)
    """Built from what the action means, so it survives a lost checkpoint."""
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    tool_use_id: Mapped[str | None] = mapped_column(String(200))
    tool: Mapped[str] = mapped_column(String(100))
    service: Mapped[str] = mapped_column(String(100))
    args: Mapped[dict[str, Any]]
    """The arguments as recorded before the first send: what an approver sees and what is
    sent, whatever a later call under the same key passes."""
    args_hash: Mapped[str | None] = mapped_column(String(64))
    """SHA-256 of the canonical JSON of `args`: an approval can name the arguments it saw."""
    state: Mapped[ActionState] = mapped_column(status_column(ActionState, "action_state"))
    attempts: Mapped[int] = mapped_column(default=0)
    first_attempt_at: Mapped[datetime | None]
    last_attempt_at: Mapped[datetime | None]
    result: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    resolution: Mapped[str | None] = mapped_column(String(64))
    """How an unknown outcome was settled: resent, lookup, person."""

    requires_approval: Mapped[bool] = mapped_column(default=False)
    approvers: Mapped[list[Any] | None]
    decision: Mapped[str | None] = mapped_column(String(16))
    decided_by: Mapped[str | None] = mapped_column(String(200))
    decided_at: Mapped[datetime | None]
    note: Mapped[str | None] = mapped_column(Text)
    compacted_at: Mapped[datetime | None]
    """When retention dropped the personal data of its arguments and result (its run
    compacted while it was settled, or the first compaction after it settled)."""

    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()

    __table_args__ = (
        Index("ix_actions_run_id", "run_id"),
        Index("ix_actions_state", "state"),
    )


class ActionAudit(Base):
    """Append-only: every decision, resolution and retry of an action, by whom and how they
    were authenticated. The action row keeps only the latest decision."""

    __tablename__ = "action_audit"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    action_key: Mapped[str] = mapped_column(String(200))
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    """The run the action belonged to at the time."""
    event: Mapped[str] = mapped_column(String(32))
    """approve, reject, happened, did_not_happen, retry; by nightshift when the run ended:
    withdrawn (before anyone decided), run_ended (released, or its outcome now unknown)."""
    by: Mapped[str] = mapped_column(String(200))
    via: Mapped[str] = mapped_column(String(200))
    """How `by` was established: a token (named by its prefix), a proxy header, the CLI with
    the OS user or an explicit --as."""
    args_hash: Mapped[str | None] = mapped_column(String(64))
    """The arguments the action had when this happened (what an approval approved)."""
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()

    __table_args__ = (Index("ix_action_audit_action_key", "action_key"),)
