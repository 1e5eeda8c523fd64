"""Batches: a night's fan-out, its caps and its synthesis."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Numeric, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column, status_column, updated_at_column
from models.status import BatchStatus


class Batch(Base):
    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    """`<schedule>:<slot>` for scheduled batches, so a slot can only create one."""
    name: Mapped[str] = mapped_column(String(100))
    """The job, e.g. competitor_monitor."""
    status: Mapped[BatchStatus] = mapped_column(
        status_column(BatchStatus, "batch_status"), default=BatchStatus.RUNNING
    )
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    token_cap: Mapped[int | None] = mapped_column(BigInteger)
    cost_cap_usd: Mapped[float | None] = mapped_column(Numeric(12, 4))
    tool_call_cap: Mapped[int | None] = mapped_column(BigInteger)
    """Tool calls over all the batch's runs; the batch stops (reason budget) before passing it."""
    synthesis_run_id: Mapped[uuid.UUID | None] = mapped_column(
        # use_alter: runs point at batches too; the cycle is closed after both tables exist.
        ForeignKey("runs.id", ondelete="SET NULL", use_alter=True)
    )
    stop_reason: Mapped[str | None] = mapped_column(String(64))
    deadline: Mapped[datetime | None]
    """Every run of the batch, its synthesis included, must be finished by then."""
    notify_url: Mapped[str | None] = mapped_column(String(2000))
    """POSTed a signed event when the batch ends or one of its runs waits for a person."""
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()
    finished_at: Mapped[datetime | None]
