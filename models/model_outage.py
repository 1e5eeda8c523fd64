"""Model provider outages: one row per model the runtime found down, while runs wait on it.

A step that keeps getting temporary errors (429, 529, 5xx, no connection) opens the row and
parks its run on `model:<model>`; the tick sends one probe at a time (`probe_run_id`) once
`probe_at` is due, marks the outage recovered when the probe's reply is journaled, and then
wakes the waiting runs a few at a time. The row goes once no run waits on the model.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import String, Text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column


class ModelOutage(Base):
    __tablename__ = "model_outages"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    since: Mapped[datetime]
    """When a step first gave up on the model in this outage."""
    last_error: Mapped[str] = mapped_column(Text)
    """The provider's last temporary error (status and message, no credentials)."""
    probe_at: Mapped[datetime]
    """The next probe is sent no earlier: backoff with jitter, and never before a reply's
    retry-after."""
    probes: Mapped[int] = mapped_column(default=0)
    """Probes that failed so far (the backoff's exponent)."""
    probe_run_id: Mapped[uuid.UUID | None]
    """The run woken to make the one probe in flight, if any."""
    probe_started_at: Mapped[datetime | None]
    probe_until: Mapped[datetime | None]
    """A probe that has not answered by then is given up, and another run probes."""
    recovered_at: Mapped[datetime | None]
    """When a probe got a reply: from then on the waiting runs are woken, paced."""
    created_at: Mapped[datetime] = created_at_column()
