"""One row per side effect: the idempotency key is saved before the first send.

A tool call's side effect (kind `tool`) and a webhook nightshift owes (kind `webhook`: a run's
or batch's completion webhook, an alert's) are the same rows, states and statements
(models/sql/actions.sql); a webhook is sent after what it announces committed, by
pipeline/delivery/, so it carries its own claim (`fence`, `lease_expires_at`) and retry schedule
(`next_attempt_at`, `dispatched_at`) where a tool's action has its run's lease.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column, status_column, updated_at_column
from models.status import ActionKind, ActionState


class Action(Base):
    __tablename__ = "actions"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    idempotency_key: Mapped[str] = mapped_column(String(200), unique=True)
    """Built from what the action means, so it survives a lost checkpoint. A webhook's:
    `run:<id>:finished`, `run:<id>:waiting:<event id>`, `batch:<id>:finished`,
    `batch:<id>:waiting:<event id>`, `alert:<id>`, sent as the Idempotency-Key header."""
    kind: Mapped[ActionKind] = mapped_column(
        status_column(ActionKind, "action_kind"), server_default=ActionKind.TOOL.value
    )
    run_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    """The run that owns it. NULL only for a webhook about no run: a batch's end, an alert
    about a batch. (No pseudo-run: every read of runs would have to skip it.)"""
    batch_id: Mapped[str | None] = mapped_column(String(200))
    """A webhook's batch, if it is about one (retention deletes it with the batch)."""
    tool_use_id: Mapped[str | None] = mapped_column(String(200))
    tool: Mapped[str] = mapped_column(String(100))
    """A webhook's event: run.finished, run.waiting, batch.finished, batch.waiting, alert."""
    service: Mapped[str] = mapped_column(String(100))
    args: Mapped[dict[str, Any]]
    """The arguments as recorded before the first send: what an approver sees and what is
    sent, whatever a later call under the same key passes. A webhook's: `url`, `event_id`
    (the run_events row it describes) or `alert_id`, and from its first attempt `body`, the
    bytes every attempt sends."""
    args_hash: Mapped[str | None] = mapped_column(String(64))
    """SHA-256 of the canonical JSON of `args`: an approval can name the arguments it saw."""
    state: Mapped[ActionState] = mapped_column(status_column(ActionState, "action_state"))
    attempts: Mapped[int] = mapped_column(default=0)
    first_attempt_at: Mapped[datetime | None]
    last_attempt_at: Mapped[datetime | None]
    result: Mapped[dict[str, Any] | None]
    """The reply saved; a webhook's: {"status": <HTTP status>}."""
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

    # A webhook's own claim and schedule (a tool's action is held by its run's lease).
    fence: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    """Bumped by every claim of a webhook: a sender that lost its claim can record nothing."""
    lease_expires_at: Mapped[datetime | None]
    """While a sender holds the webhook: past it, the sender is taken for dead."""
    next_attempt_at: Mapped[datetime] = mapped_column(server_default=text("now()"))
    """When a webhook's next attempt is due."""
    dispatched_at: Mapped[datetime | None]
    """When a delivery task was last sent and not yet claimed (the tick does not send another
    before the hand-off grace)."""
    created_xid: Mapped[int] = mapped_column(
        BigInteger, server_default=text("(pg_current_xact_id())::text::bigint")
    )
    """The transaction that recorded it: for a webhook, the code that made the transition it
    announces sends its first task."""

    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()

    __table_args__ = (
        Index("ix_actions_run_id", "run_id"),
        Index("ix_actions_state", "state"),
        # The tick's query: webhooks still owed whose next attempt is due.
        Index(
            "ix_actions_webhooks_due",
            "next_attempt_at",
            postgresql_where=text(
                "kind = 'webhook' AND state IN ('intended', 'attempted', 'outcome_unknown')"
            ),
        ),
        Index("ix_actions_batch_id", "batch_id", postgresql_where=text("batch_id IS NOT NULL")),
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
