"""Per-person API tokens: who a request speaks for. Only a hash of each token is kept."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import String, Text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    identity: Mapped[str] = mapped_column(String(200))
    """Who the token speaks for: recorded as `decided_by`, matched against approvers."""
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    """The token's first characters, to name it in lists and the audit trail."""
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """SHA-256 of the whole token (random, 256 bits: no salt or slow hash needed)."""
    note: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = created_at_column()
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    revoked_by: Mapped[str | None] = mapped_column(String(200))
