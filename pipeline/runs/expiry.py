"""Parked runs that nothing will end: a run waiting on an approval, a timer or a person holds
no worker, so no step would ever see its deadline pass. The tick ends such runs with reason
`deadline`, and a run parked with no deadline for longer than the maximum wait
(NIGHTSHIFT_MAX_WAIT_DAYS, default 30) with reason `expired`, whatever it waits on (a timer
further off than that ends it at the maximum wait, not at the timer), and withdraws their
pending approvals, in one transaction, so a later approval is refused. A run waiting out a
model provider outage ends `model_unavailable` at the outage's horizon (its wake_at)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import Row, Select, func, select
from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import Run, RunStatus
from pipeline.keys import MODEL_WAIT_PREFIX
from pipeline.logs import get_logger
from pipeline.runs import fanout
from pipeline.runs.obligations import settle_actions_of_ended_txn

log = get_logger("nightshift.expiry")

REASON = "deadline"
MODEL_REASON = "model_unavailable"
EXPIRED = "expired"
"""The stop reason of a run that waited longer than the maximum wait with no deadline."""

# A parked run as the expiry picks it: id, waiting_on, wake_at, error (what its error says).
_Parked = Select[uuid.UUID, str | None, datetime | None, str | None]
_ParkedRow = Row[uuid.UUID, str | None, datetime | None, str | None]


def expire_parked_txn(session: Session, limit: int) -> list[uuid.UUID]:
    """End the parked runs whose deadline has passed; returns their ids."""
    due = _parked().where(Run.deadline <= func.now()).order_by(Run.deadline)

    def error(run: _ParkedRow) -> str:
        return f"the run's deadline passed while it waited on {run.waiting_on or ''}"

    ids = _end_parked_txn(session, due, limit, REASON, error)
    if ids:
        log.info("ended %d waiting run(s) past their deadline", len(ids))
    return ids


def expire_abandoned_txn(session: Session, max_wait: timedelta, limit: int) -> list[uuid.UUID]:
    """End the runs parked longer than `max_wait` with no deadline (an approval nobody gives, a
    person nobody finds, a timer set months ahead); returns their ids. A timer due sooner
    wakes its run first: a run parks again (and counts afresh) only by running a step."""
    due = (
        _parked()
        .where(Run.deadline.is_(None), Run.updated_at <= func.now() - max_wait)
        .order_by(Run.updated_at)
    )

    def error(run: _ParkedRow) -> str:
        return (
            f"the run waited on {run.waiting_on or ''} for longer than {max_wait.days} days "
            f"(NIGHTSHIFT_MAX_WAIT_DAYS) with no deadline{_timer_note(run.wake_at)}"
        )

    ids = _end_parked_txn(session, due, limit, EXPIRED, error)
    if ids:
        log.info("ended %d run(s) parked past the maximum wait", len(ids))
    return ids


def _timer_note(wake_at: datetime | None) -> str:
    """`; its timer was set for <when> UTC` for a run that waited on a timer, else nothing."""
    if wake_at is None:
        return ""
    return f"; its timer was set for {wake_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"


def expire_model_waits_txn(session: Session, limit: int) -> list[uuid.UUID]:
    """End the runs that waited on a model provider past the outage horizon (a wait on the model
    keeps that instant in wake_at; the outages' probe and pacing wake it sooner)."""
    due = (
        _parked()
        .where(
            Run.status == RunStatus.WAITING,
            Run.waiting_on.startswith(MODEL_WAIT_PREFIX, autoescape=True),
            Run.wake_at <= func.now(),
        )
        .order_by(Run.wake_at)
    )

    def error(run: _ParkedRow) -> str:
        return (
            "the model provider stayed unavailable past NIGHTSHIFT_MODEL_OUTAGE_HORIZON_SECONDS: "
            f"{run.error or ''}"
        )

    ids = _end_parked_txn(session, due, limit, MODEL_REASON, error)
    if ids:
        log.info("ended %d run(s) that waited on the model past the outage horizon", len(ids))
    return ids


def _parked() -> _Parked:
    """The parked runs, with what their error message says (_Parked)."""
    return select(Run.id, Run.waiting_on, Run.wake_at, Run.error).where(
        Run.status.in_(RunStatus.parked())
    )


def _end_parked_txn(
    session: Session,
    due: _Parked,
    limit: int,
    reason: str,
    error: Callable[[_ParkedRow], str],
) -> list[uuid.UUID]:
    """End the first `limit` runs `due` picks (locking them, skipping those locked), each with
    its own error (runs.sql end_parked)."""
    picked = session.execute(due.limit(limit).with_for_update(skip_locked=True)).all()
    if not picked:
        return []
    expired = statements.rows(
        session,
        "end_parked",
        reason=reason,
        run_ids=[run.id for run in picked],
        errors=[error(run) for run in picked],
    )
    if not expired:
        return []
    ids = [row.id for row in expired]
    settle_actions_of_ended_txn(session, ids, reason)
    for run_id in ids:  # a batch's synthesis ends its batch
        fanout.synthesis_finished_txn(session, run_id, RunStatus.FAILED)
    for batch_id in sorted({row.batch_id for row in expired if row.batch_id}):
        fanout.child_finished_txn(session, batch_id)
    return ids
