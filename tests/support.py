"""Helpers for tests: service URLs and polling (worker processes: pipeline.processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import ColumnElement, select

from models import Action, ActionKind, ActionState
from pipeline.processes.celery_process import wait_for


def nightshift(
    *argv: str, timeout: float = 120, **env: str | None
) -> subprocess.CompletedProcess[str]:
    """The real command in a fresh process, in this one's environment with `env` on top (a None
    value removes the variable)."""
    environment = {k: v for k, v in os.environ.items() if k not in env}
    environment |= {k: v for k, v in env.items() if v is not None}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *argv],
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass(frozen=True)
class ServiceUrls:
    database: str
    broker: str

    def database_url(self, name: str) -> str:
        parts = urlsplit(self.database)
        scheme = "postgresql+psycopg"
        return urlunsplit(parts._replace(scheme=scheme, path=f"/{name}"))

    def admin_conninfo(self, name: str) -> str:
        parts = urlsplit(self.database)
        return urlunsplit(parts._replace(scheme="postgresql", path=f"/{name}"))


def run_row(run_id: uuid.UUID) -> Any:
    from models import Run
    from pipeline.db import transaction

    with transaction() as session:
        return session.execute(select(Run).where(Run.id == run_id)).scalar_one()


def tool_results_of(run_id: uuid.UUID | str) -> list[str]:
    """The content of each tool result the run journaled, in order."""
    from models import JournalEntry
    from pipeline.db import transaction

    with transaction() as session:
        entries = session.scalars(
            select(JournalEntry).where(JournalEntry.run_id == run_id).order_by(JournalEntry.id)
        )
        return [e.payload["content"] for e in entries if e.key.startswith("tool:")]


def claim(run_id: uuid.UUID, owner: str, lease_seconds: float) -> Any:
    """Claim the run as a step does (pipeline.engine.leases.take): its Lease, or None."""
    from pipeline.engine.leases import Lease, take
    from pipeline.settings import get_settings

    claimed = take(run_id, owner, lease_seconds, get_settings())
    return Lease(run_id, claimed.fence, owner) if claimed is not None else None


def wait_for_status(run_id: uuid.UUID, statuses: set[str], timeout: float = 60.0) -> Any:
    def probe() -> Any:
        row = run_row(run_id)
        return row if row.status in statuses else None

    return wait_for(probe, timeout=timeout, interval=0.2, what=f"run {run_id} to reach {statuses}")


def tool_results(run_id: uuid.UUID, tool: str) -> list[dict[str, Any]]:
    """The journaled results of `tool`'s calls in the run, in the order they were journaled."""
    from models import JournalEntry
    from pipeline.db import transaction

    with transaction() as session:
        query = select(JournalEntry.payload).where(
            JournalEntry.run_id == run_id, JournalEntry.step_name == tool
        )
        ordered = query.order_by(JournalEntry.step, JournalEntry.id)
        return [p for p in session.scalars(ordered) if "content" in p]


def artifact_text(run_id: uuid.UUID, artifact_id: int) -> str:
    """An artifact's content as PostgreSQL keeps it (whatever host wrote it)."""
    from pipeline.views.artifacts import artifact_bytes

    kept = artifact_bytes(run_id, artifact_id)
    assert kept.data is not None, kept.missing
    return kept.data.decode()


@dataclass(frozen=True)
class Webhook:
    """A webhook action (kind `webhook`) as the webhook tests read it: its key names it."""

    key: str
    event: str
    state: ActionState
    attempts: int
    url: str
    alert_id: int | None
    response_status: int | None
    error: str | None
    next_attempt_at: datetime
    updated_at: datetime
    run_id: uuid.UUID | None


def webhooks(*where: ColumnElement[bool]) -> list[Webhook]:
    """The webhook actions (those `where` selects), oldest first."""
    from pipeline.db import transaction

    with transaction() as session:
        rows = session.scalars(
            select(Action)
            .where(Action.kind == ActionKind.WEBHOOK, *where)
            .order_by(Action.created_at, Action.idempotency_key)
        ).all()
        return [
            Webhook(row.idempotency_key, row.tool, row.state, row.attempts, row.args["url"],
                    row.args.get("alert_id"), (row.result or {}).get("status"), row.error,
                    row.next_attempt_at, row.updated_at, row.run_id)
            for row in rows
        ]  # fmt: skip
