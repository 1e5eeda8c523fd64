"""Schedule slots: one row per (schedule, slot), what firing it decided, so two beats or a
redelivered check cannot start a slot twice."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column, status_column, updated_at_column
from models.status import FireDecision


class ScheduleFire(Base):
    __tablename__ = "schedule_fires"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    schedule: Mapped[str] = mapped_column(String(100))
    slot: Mapped[datetime]
    """The slot's instant (UTC), computed in the schedule's own timezone."""
    decision: Mapped[FireDecision] = mapped_column(status_column(FireDecision, "fire_decision"))
    reason: Mapped[str] = mapped_column(Text)
    """Why, in words: the policy that decided and what it saw (e.g. which run was busy)."""
    run_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    batch_id: Mapped[str | None] = mapped_column(String(200))
    duplicates: Mapped[int] = mapped_column(server_default=text("0"))
    """How many more times this slot was asked for (a manual fire, a racing check): each
    started nothing."""
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()

    __table_args__ = (UniqueConstraint("schedule", "slot"),)
