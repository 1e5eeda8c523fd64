"""Signed webhook deliveries already received: the replay cache, shared by every API process."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, String
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column


class WebhookDelivery(Base):
    """One signature seen inside its timestamp window; the same signature again is a replay."""

    __tablename__ = "webhook_deliveries"

    signature: Mapped[str] = mapped_column(String(64), primary_key=True)
    """The hex HMAC of the delivery (it reveals nothing about the secret)."""
    received_at: Mapped[datetime] = created_at_column()

    __table_args__ = (Index("ix_webhook_deliveries_received_at", "received_at"),)
