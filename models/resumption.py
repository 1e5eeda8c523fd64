"""Takeovers: each time a run lost its worker and another one (or the tick) picked it up.

The tick opens a row when it finds a run nobody is moving; the next successful claim closes
it. A claim that finds an expired lease without the tick's help records the row itself.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

from sqlalchemy import BigInteger, ForeignKey, Index, text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column, status_column


class ResumeCause(StrEnum):
    LEASE_EXPIRED = "lease_expired"
    """The worker holding the run stopped renewing its lease (died, froze, lost the network)."""
    NO_MESSAGE = "no_message"
    """Runnable with no lease and no write for longer than a lease: the step message was lost
    (a crash between the checkpoint's commit and the send) or is stuck behind a backlog."""


class Resumption(Base):
    __tablename__ = "resumptions"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    cause: Mapped[ResumeCause] = mapped_column(status_column(ResumeCause, "resume_cause"))
    lost_at: Mapped[datetime]
    """When the run stopped moving: the lost lease's expiry, or (no message) its last write."""
    resumed_at: Mapped[datetime | None]
    """When a worker claimed the run again; null while nobody has."""
    fence: Mapped[int | None] = mapped_column(BigInteger)
    """The fence of the claim that resumed the run."""
    created_at: Mapped[datetime] = created_at_column()

    __table_args__ = (
        Index("ix_resumptions_run_id", "run_id"),
        # At most one open takeover per run: the tick may find the same orphan twice.
        Index(
            "uq_resumptions_open_run_id",
            "run_id",
            unique=True,
            postgresql_where=text("resumed_at IS NULL"),
        ),
    )
