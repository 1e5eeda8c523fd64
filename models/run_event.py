"""The progress feed's record: one row per change a person watching a run cares about.

Rows are written by PostgreSQL triggers (the run_events migration) in the very transaction
that made the change (a run created, claimed by a step, changing status; a journal entry; an
action created or changing state; a batch changing status), so an event exists exactly when
its change was committed. Readers (pipeline/views/feed.py) order them by (xid, id) and
deliver only rows of transactions older than every transaction still open in this database:
a row committed later can never land behind a position already delivered.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, String, text
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, created_at_column


class RunEvent(Base):
    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    xid: Mapped[int] = mapped_column(
        BigInteger, server_default=text("(pg_current_xact_id())::text::bigint")
    )
    """The writing transaction's id (64-bit, never wraps): the feed's order and horizon."""
    # No foreign keys: checking one would take a lock on the run row from every transaction
    # that writes an event (a decision's, say), against the engine's lock order. Runs and
    # batches are never deleted.
    run_id: Mapped[uuid.UUID | None]
    batch_id: Mapped[str | None] = mapped_column(String(200))
    """Set for a batch's own status changes; a run's events carry only run_id."""
    kind: Mapped[str] = mapped_column(String(32))
    """created, claimed, status, journal, action, batch (triggers write them) or version (the
    step that ran under another agent version): what changed (the reader names it)."""
    journal_id: Mapped[int | None] = mapped_column(BigInteger)
    """The journal row a `journal` event records."""
    data: Mapped[dict[str, Any]]
    """The change as the trigger saw it: new and previous status or state, keys, step."""
    created_at: Mapped[datetime] = created_at_column()

    __table_args__ = (
        Index("ix_run_events_run_position", "run_id", "xid", "id"),
        Index(
            "ix_run_events_batch_position",
            "batch_id",
            "xid",
            "id",
            postgresql_where=text("batch_id IS NOT NULL"),
        ),
    )
