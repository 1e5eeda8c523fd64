"""Completion webhooks: one row per event a run's (or batch's) `notify_url` is told about.

A row is written by the run and batch status triggers (the notifications migration) in the
transaction of the transition itself, so it can never be lost: a run finishing, or starting to
wait for a person (an approval, an unknown outcome). Its idempotency key is saved before the
first attempt and sent with every one; delivery follows the action protocol's states
(intended -> attempted -> confirmed, attempted with no saved reply -> outcome_unknown -> sent
again with the same key; failed when the receiver refuses or retries run out). A budget alert's
webhook is a row too, written with the alert in its fenced transaction (pipeline/engine/budgets.py).
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, Index, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column, status_column, updated_at_column
from models.status import ActionState


class Notification(Base):
    __tablename__ = "notifications"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    idempotency_key: Mapped[str] = mapped_column(String(200), unique=True)
    """`run:<id>:finished`, `run:<id>:waiting:<event>`, `batch:<id>:finished`, `alert:<id>`,
    ...: one per transition (or alert), sent as the Idempotency-Key header of every attempt."""
    event: Mapped[str] = mapped_column(String(32))
    """run.finished, run.waiting, batch.finished, batch.waiting or alert."""
    # No foreign keys, as in run_events: runs and batches are never deleted.
    run_id: Mapped[uuid.UUID | None]
    batch_id: Mapped[str | None] = mapped_column(String(200))
    event_id: Mapped[int | None] = mapped_column(BigInteger)
    """The run_events row of the transition: what the body describes (None for an alert's)."""
    alert_id: Mapped[int | None] = mapped_column(BigInteger)
    """For an alert's webhook (event `alert`, to NIGHTSHIFT_ALERT_WEBHOOK_URL): the alert."""
    url: Mapped[str] = mapped_column(Text)
    state: Mapped[ActionState] = mapped_column(status_column(ActionState, "notification_state"))
    attempts: Mapped[int] = mapped_column(server_default=text("0"))
    fence: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    """Bumped by every claim: a sender that lost its claim can record nothing."""
    lease_expires_at: Mapped[datetime | None]
    """While a sender holds the row: past it, the sender is taken for dead."""
    next_attempt_at: Mapped[datetime] = mapped_column(server_default=text("now()"))
    dispatched_at: Mapped[datetime | None]
    """When a delivery task was last sent and not yet claimed (the tick does not send another
    before the hand-off grace)."""
    created_xid: Mapped[int] = mapped_column(
        BigInteger, server_default=text("(pg_current_xact_id())::text::bigint")
    )
    """The transaction that made the transition: its own code sends the first task."""
    body: Mapped[str | None] = mapped_column(Text)
    """The JSON sent, fixed at the first attempt so every attempt sends the same bytes."""
    first_attempt_at: Mapped[datetime | None]
    last_attempt_at: Mapped[datetime | None]
    response_status: Mapped[int | None]
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()

    __table_args__ = (
        # The tick's query: notifications still owed whose next attempt is due.
        Index(
            "ix_notifications_due",
            "next_attempt_at",
            postgresql_where=text("state IN ('intended', 'attempted', 'outcome_unknown')"),
        ),
        Index("ix_notifications_run_id", "run_id"),
        Index(
            "ix_notifications_alert_id",
            "alert_id",
            unique=True,
            postgresql_where=text("alert_id IS NOT NULL"),
        ),
    )
