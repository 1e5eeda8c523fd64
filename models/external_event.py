"""Other services' events: the de-duplication record of each event that may start a run."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column, updated_at_column


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
