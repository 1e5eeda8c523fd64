"""Worker heartbeats: which workers are alive and which queues they take steps from, so that
people can be told when nothing will move a run."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base


class WorkerHeartbeat(Base):
    __tablename__ = "worker_heartbeats"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    """The Celery node name (`worker@host`); a restarted worker takes its row over."""
    queues: Mapped[list[str]] = mapped_column(ARRAY(String(200)))
    """The broker queues it consumes (steps and control)."""
    hostname: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int]
    started_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]
    """Renewed every few seconds while the worker runs; a stale one means it is gone."""
    stopped_at: Mapped[datetime | None]
    """Set when the worker shut down cleanly."""
