"""The status page's sessions, one row a signed-in browser. Only a hash of each session's id is
kept (the cookie holds the id)."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Index, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column


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
