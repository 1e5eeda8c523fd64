"""Large outputs live as files; the database keeps their path and content hash."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    path: Mapped[str] = mapped_column(String(1000))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    media_type: Mapped[str] = mapped_column(String(100), default="text/plain")
    created_at: Mapped[datetime] = created_at_column()
    deleted_at: Mapped[datetime | None]
    """When retention deleted the file; the row stays as the record of what existed."""

    __table_args__ = (Index("ix_artifacts_run_id", "run_id"),)
