"""Alerts: budget and policy warnings, raised once per kind and subject
(models/sql/webhooks.sql raise_alert); each one's webhook is an action of kind `webhook`."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column


class Alert(Base):
    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(64))
    """e.g. budget_tokens, budget_cost, max_tool_calls."""
    subject: Mapped[str] = mapped_column(String(200))
    """What the alert is about: `batch:<id>` or `run:<id>`; one alert per kind and subject."""
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()

    __table_args__ = (UniqueConstraint("kind", "subject"),)
