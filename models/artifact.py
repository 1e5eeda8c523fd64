"""Large outputs (reports, big tool results) kept in PostgreSQL, so every host reads them."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column


class Artifact(Base):
    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    run_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    media_type: Mapped[str] = mapped_column(String(100), default="text/plain")
    content: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    """NULL once retention deleted it, or when its file was missing as migration 0026 moved
    the files in (`missing` says so). Deferred: listing a run's artifacts never loads them."""
    missing: Mapped[str | None] = mapped_column(String(300))
    """Why content that should be here is not (only migration 0026 sets it)."""
    created_at: Mapped[datetime] = created_at_column()
    deleted_at: Mapped[datetime | None]
    """When retention deleted the content; the row stays as the record of what existed."""

    __table_args__ = (Index("ix_artifacts_run_id", "run_id"),)


def artifact_url(run_id: uuid.UUID, artifact_id: int) -> str:
    """Where the API serves an artifact (pipeline/api/routes/artifacts.py)."""
    return f"/runs/{run_id}/artifacts/{artifact_id}"
