"""Append-only journal of model replies and tool results, the source of replay."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column


class JournalEntry(Base):
    __tablename__ = "journal"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))
    """`model:<step>` or `tool:<tool_use_id>`."""
    step: Mapped[int]
    step_name: Mapped[str] = mapped_column(String(200))
    """What the code asked for when it wrote this entry; replay compares it."""
    payload: Mapped[dict[str, Any]]
    compacted: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = created_at_column()

    __table_args__ = (UniqueConstraint("run_id", "key"),)
