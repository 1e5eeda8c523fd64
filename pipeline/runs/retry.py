"""Retrying a run: a failed or cancelled run started again from its original request (agent,
input, notify_url, and as much time as its deadline gave it), as a new run whose key names
its origin (`retry-of:<run id>`). A run is retried once: asking again returns that retry, and
a retry that fails is retried in its own turn. The CLI, the API and a bulk retry call this."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy.orm import Session

from models import RunStatus
from pipeline.db import transaction
from pipeline.errors import StatusConflict
from pipeline.keys import retry_key
from pipeline.logs import get_logger
from pipeline.runs.start import StartedRun, request_of, start_again_txn

log = get_logger("nightshift.retry")

RETRYABLE = frozenset({RunStatus.FAILED, RunStatus.CANCELLED})


@dataclass(frozen=True)
class Retry:
    origin: uuid.UUID
    started: StartedRun
    """The retry: created, or the one an earlier request for the same origin started."""


def retry_run_txn(session: Session, run_id: uuid.UUID, by: str) -> Retry:
    """Start `run_id` again from its original request, unless it was retried already; raise
    StatusConflict for a run that is not failed or cancelled, or whose request retention
    redacted. Its first step is sent once the caller's transaction commits."""
    origin = request_of(session, run_id)
    if origin.status not in RETRYABLE:
        raise StatusConflict(
            f"run {run_id} is {origin.status.value}: only a failed or cancelled run is retried"
        )
    if origin.compacted_at is not None:
        raise StatusConflict(
            f"run {run_id} cannot be retried: retention redacted its input on "
            f"{origin.compacted_at:%Y-%m-%d}"
        )
    started = start_again_txn(session, origin, retry_key(run_id))
    if started.created:
        log.info("run %s (%s): retried by %s as run %s", run_id, origin.status.value, by,
                 started.run_id)  # fmt: skip
    return Retry(run_id, started)


def retry_run(run_id: uuid.UUID, by: str) -> Retry:
    with transaction() as session:
        return retry_run_txn(session, run_id, by)
