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

UNFINISHED = "status NOT IN ({})".format(", ".join(f"'{s.value}'" for s in RunStatus.terminal()))
"""A run not finished yet, as SQL with the statuses written out: the predicate of
ix_runs_batch_unfinished, which PostgreSQL uses only for a query that says it the same way
(not with a parameter list)."""


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
    failed_step: Mapped[int | None]
    """The step whose attempts failed last (its worker lost, its lease lost with no
    checkpoint, its time bound hit): `failed_attempts` counts for it while `step` equals it."""
    failed_attempts: Mapped[int] = mapped_column(default=0, server_default="0")
    """Consecutive failed attempts of `failed_step` that count towards the agent's
    max_step_attempts: its first failure, then only those it did not share (a failure while
    it ran alone in quarantine, or its own time bound): pipeline/runs/failed_attempts.py."""
    failures: Mapped[list[Any]] = mapped_column(default=list, server_default="[]")
    """Each failed attempt of `failed_step`: kind, worker, whether it counted, when."""
    quarantine_fence: Mapped[int | None] = mapped_column(BigInteger)
    """The fence of the last attempt that ran in quarantine (alone among suspects in its
    process): a failure of that attempt is the run's own."""

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
    """nightshift's own version where the run was started."""
    agent_version: Mapped[str | None] = mapped_column(String(80))
    """The agent's version the run started under: its distribution's version and a digest of
    what changes behaviour (`0.1.0+4b44300175daae31`, pipeline.registry.agent_version)."""
    running_version: Mapped[str | None] = mapped_column(String(80))
    """The agent version its last step ran under: recorded again by every step that runs
    under another one."""
    allowed_version: Mapped[str | None] = mapped_column(String(80))
    """The version a person allowed the run to go on under (`nightshift allow`), when the
    agent's on_version_change parked it."""
    prompt_version: Mapped[str] = mapped_column(String(64))
    """Hash of the agent's system prompt, tools and model settings."""

    result: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    stop_reason: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = updated_at_column()
    finished_at: Mapped[datetime | None]
    compacted_at: Mapped[datetime | None]
    """When retention redacted the run's personal data; its deletion window starts here."""
    trace_context: Mapped[dict[str, Any] | None]
    """Where the run sits in a trace: its run span's W3C `traceparent` (and `tracestate`), as
    the configured OTEL_PROPAGATORS wrote them when it was started; every step's span, on any
    worker, continues it (pipeline/tracing.py). NULL: started outside any trace."""
    outcome_published: Mapped[bool] = mapped_column(server_default=text("false"))
    """Whether the tick put the finished run's outcome in Celery's result backend, under the
    run's id (`AsyncResult(run_id).get()` for a client with only Celery)."""

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
        # A batch's children in the order its page and `batches show` list them (newest
        # first, then id), and the batch's sums: no scan of every run for a big night.
        Index("ix_runs_batch_listed", "batch_id", text("created_at DESC"), "id"),
        # Whether a batch has a child left, asked by every child that finishes: only the
        # unfinished ones are in it, so the answer does not read the finished thousands.
        Index(
            "ix_runs_batch_unfinished",
            "batch_id",
            postgresql_where=text(UNFINISHED),
        ),
        # Retention's second stage: compacted runs whose deletion window has passed.
        Index(
            "ix_runs_compacted_at",
            "compacted_at",
            postgresql_where=text("compacted_at IS NOT NULL"),
        ),
        Index("ix_runs_status_agent", "status", "agent"),
        # The nightly cap's sum: every run created in the night's window.
        Index("ix_runs_created_at", "created_at"),
        # The tick's outcome query: finished runs whose outcome is not in the backend yet.
        Index(
            "ix_runs_outcome_unpublished",
            "finished_at",
            postgresql_where=text(
                "NOT outcome_published AND status IN ('succeeded', 'failed', 'cancelled')"
            ),
        ),
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
