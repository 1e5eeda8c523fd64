"""The schedule definitions beat fires by, as beat stored them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column


class BeatSchedules(Base):
    """The schedule definitions beat fires by, stored when it starts: workers that check the
    slots and the CLI that lists them read these, so what is listed is what fires, whichever
    process holds the schedules file. One row."""

    __tablename__ = "beat_schedules"

    id: Mapped[int] = mapped_column(primary_key=True)
    definitions: Mapped[list[Any]]
    """Each schedule as a schedules-file entry (`Schedule.to_json`)."""
    stored_by: Mapped[str] = mapped_column(Text)
    """The beat that stored them: host and pid."""
    stored_at: Mapped[datetime] = created_at_column()
