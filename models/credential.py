"""Per-person API tokens (who a request speaks for) and the status page's sessions. Only a hash
of each token and of each session's id is kept."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Index, String, Text
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


class StatusPageSession(Base):
    """A signed-in browser: the session lives while its row does (sign-out deletes it, and so
    does revoking the token it signed in with), however long the cookie says."""

    __tablename__ = "status_page_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    """SHA-256 of the session's random id, which only the cookie holds."""
    who: Mapped[str] = mapped_column(String(200))
    via: Mapped[str] = mapped_column(String(200))
    token_id: Mapped[uuid.UUID | None]
    """The person token it signed in with (None: the proxy header, or --insecure-no-auth)."""
    created_at: Mapped[datetime] = created_at_column()
    expires_at: Mapped[datetime]

    __table_args__ = (
        Index("ix_status_page_sessions_expires_at", "expires_at"),
        Index("ix_status_page_sessions_token_id", "token_id"),
    )
