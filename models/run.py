"""The run record: the checkpoint every worker continues from."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, Numeric, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.sql.elements import ColumnElement

from models.base import Base, created_at_column, status_column, updated_at_column
from models.status import RunStatus


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    agent: Mapped[str] = mapped_column(String(100))
    status: Mapped[RunStatus] = mapped_column(
        status_column(RunStatus, "run_status"), default=RunStatus.RUNNING
    )
    input: Mapped[dict[str, Any]]
    """The original request, exactly as the caller sent it."""
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    """A caller's key: a second start with the same key returns this run."""
    parent_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("runs.id"))
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id"))

    step: Mapped[int] = mapped_column(default=0)
    """Number of completed steps; the next step's journal keys use this number."""
    max_steps: Mapped[int] = mapped_column(default=50)
    tool_calls: Mapped[int] = mapped_column(default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_creation_input_tokens: Mapped[int] = mapped_column(
        BigInteger, default=0, server_default="0"
    )
    """Input tokens written to the prompt cache (not counted in input_tokens)."""
    cache_read_input_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    """Input tokens read from the prompt cache (not counted in input_tokens)."""
    cost_usd: Mapped[float] = mapped_column(
        Numeric(18, 8, asdecimal=False), default=0, server_default="0"
    )
    """The model calls' cost, each priced for the model that answered when it was recorded."""
    state: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """Small structured state the agent keeps (plan, facts, artifact refs)."""

    fence: Mapped[int] = mapped_column(BigInteger, default=0)
    """Bumped by every claim; a write carrying an older fence is refused."""
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None]
    attempt: Mapped[int] = mapped_column(default=0)
    """How many times a step of this run has been claimed."""

    wake_at: Mapped[datetime | None]
    waiting_on: Mapped[str | None] = mapped_column(String(200))
    notify_url: Mapped[str | None] = mapped_column(String(2000))
    """POSTed a signed event when the run finishes or starts waiting for a person."""
    deadline: Mapped[datetime | None]
    """The run must be finished by then: a step stops at its next check, and the tick ends a
    waiting run (reason `deadline`) and withdraws its pending approvals."""
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    cancel_requested_by: Mapped[str | None] = mapped_column(String(200))
    cancel_requested_at: Mapped[datetime | None]

    code_version: Mapped[str] = mapped_column(String(64))
    prompt_version: Mapped[str] = mapped_column(String(64))
    """Hash of the agent's system prompt, tools and model settings."""

    result: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    stop_reason: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()
    finished_at: Mapped[datetime | None]

    __table_args__ = (
        # The tick's hot query: runnable runs whose lease is missing or expired.
        Index(
            "ix_runs_runnable_lease",
            "lease_expires_at",
            postgresql_where=text("status = 'running'"),
        ),
        # The tick's other hot query: waiting runs whose timer is due.
        Index("ix_runs_due_wake_at", "wake_at", postgresql_where=text("status = 'waiting'")),
        # The tick's deadline query: parked runs that have a deadline.
        Index(
            "ix_runs_parked_deadline",
            "deadline",
            postgresql_where=text(
                "status IN ('waiting', 'needs_attention') AND deadline IS NOT NULL"
            ),
        ),
        Index("ix_runs_batch_id", "batch_id"),
        Index("ix_runs_status_agent", "status", "agent"),
    )


def tokens_used(runs: Any = Run) -> ColumnElement[int]:
    """Every token of a run's model calls, as the API counts them: input (cache writes and
    reads are not in input_tokens) plus output. Token caps and token totals use this.

    `runs`: the mapped class, or `Run.__table__.c` for a plain Core statement (no ORM)."""
    return (
        runs.input_tokens
        + runs.cache_creation_input_tokens
        + runs.cache_read_input_tokens
        + runs.output_tokens
    )
