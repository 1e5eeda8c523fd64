"""A person allows a run parked on a changed agent version to go on under that version.

The run waits in needs_attention on `version:<agent version>` when its agent's
on_version_change is `park`, or when a replayed tool call names a tool the new release no
longer has. Allowing records the version on the run (its next step goes on under it, and a
tool gone meanwhile is answered as removed, not run) and who allowed it in the audit trail.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import select

import pipeline.statements as statements
from models import Run, RunStatus
from pipeline.db import transaction
from pipeline.errors import RunNotFound, StatusConflict
from pipeline.keys import Wait, WaitKind
from pipeline.logs import get_logger
from pipeline.runs.decisions import Actor, audit_txn
from pipeline.runs.waits import wake_txn

log = get_logger("nightshift.versions")

ALLOW_EVENT = "allow_version"
"""The audit trail's event (action_audit, under the wait `version:<agent version>`)."""


@dataclass(frozen=True)
class Allowed:
    run_id: uuid.UUID
    version: str
    why: str | None
    """What the run was parked for."""


def allow_version(run_id: uuid.UUID, actor: Actor, note: str | None = None) -> Allowed:
    """Let the run go on under the agent version it waits on; StatusConflict if it does not
    wait for that."""
    with transaction() as session:
        row = session.execute(
            select(Run.status, Run.waiting_on, Run.error).where(Run.id == run_id).with_for_update()
        ).one_or_none()
        if row is None:
            raise RunNotFound(f"no run has id {run_id}")
        wait = _version_wait(row.waiting_on)
        if row.status is not RunStatus.NEEDS_ATTENTION or wait is None:
            raise StatusConflict(
                f"run {run_id} is {row.status}"
                + (f" on {row.waiting_on}" if row.waiting_on else "")
                + ": it does not wait for a person to allow a new agent version"
            )
        statements.execute(session, "allow_version", run_id=run_id, version=wait.ref)
        audit_txn(session, str(wait), run_id, ALLOW_EVENT, actor, note or row.error)
        wake_txn(session, [run_id])
    log.info(
        "run %s: agent version %s allowed by %s (%s)", run_id, wait.ref, actor.identity, actor.via
    )
    return Allowed(run_id, wait.ref, row.error)


def _version_wait(waiting_on: str | None) -> Wait | None:
    if not waiting_on:
        return None
    try:
        wait = Wait.parse(waiting_on)
    except ValueError:
        return None
    return wait if wait.kind is WaitKind.VERSION else None
