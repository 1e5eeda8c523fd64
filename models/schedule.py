"""Schedule slots and external events: the de-duplication records for what starts runs."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

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


class BeatSchedules(Base):
    """The schedule definitions beat fires by, stored when it starts: workers that check the
    slots and the CLI that lists them read these, so what is listed is what fires, whichever
    process holds the schedules file. One row."""

    __tablename__ = "beat_schedules"

    id: Mapped[int] = mapped_column(primary_key=True)
    definitions: Mapped[list[Any]]
    """Each schedule as a schedules-file entry (`Schedule.to_json`)."""
    stored_by: Mapped[str] = mapped_column(Text)
    """The beat that stored them: host and pid."""
    stored_at: Mapped[datetime] = created_at_column()


class ExternalEvent(Base):
    """Another service's event (POST /events/{source}), once per (source, event id); the
    progress feed's entries are RunEvent (models/run_event.py), a different thing."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(100))
    event_id: Mapped[str] = mapped_column(String(200))
    run_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    payload: Mapped[dict[str, Any]]
    deliveries: Mapped[int] = mapped_column(default=1)
    """How many times the event arrived; only the first started a run."""
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()
    """When the latest delivery arrived."""

    __table_args__ = (UniqueConstraint("source", "event_id"),)
