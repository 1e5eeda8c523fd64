"""Model provider outages in the durable record (models.ModelOutage): opening one, reading it,
and the tick's part: one probe at a time per model, then the waiting runs woken at a pace.

A step opens (or extends) the outage when the provider keeps failing and parks its run on
`model:<model>` with no slot held. The tick wakes one waiting run as the probe once `probe_at`
is due; the probe's journaled reply is what says the provider answers again. A probe that fails
pushes `probe_at` back (doubling, jitter, at least the reply's retry-after). Rows, not process
memory: every worker host and every tick sees the same outage and the same probe.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, exists, func, literal, or_, select
from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import ModelOutage, Run, RunStatus
from pipeline.keys import MODEL_WAIT_PREFIX, model_wait
from pipeline.runs.waits import wake_txn
from pipeline.settings import Settings

FIRST_PROBE_SECONDS = 5.0
"""The first probe of an outage goes out about this long after it opened (jittered)."""


@dataclass(frozen=True)
class Outage:
    model: str
    since: datetime
    probe_run_id: uuid.UUID | None
    recovered: bool
    last_error: str

    def gives_up_at(self, settings: Settings) -> datetime:
        """When the runs waiting out this outage fail model_unavailable."""
        return self.since + timedelta(seconds=settings.model_outage_horizon_seconds)


def outage_of_txn(session: Session, model: str) -> Outage | None:
    row = session.get(ModelOutage, model, populate_existing=True)
    return None if row is None else _outage(row)


def _outage(row: ModelOutage) -> Outage:
    return Outage(
        row.model, row.since, row.probe_run_id, row.recovered_at is not None, row.last_error
    )


def gave_up_txn(
    session: Session,
    model: str,
    run_id: uuid.UUID,
    error: str,
    retry_after: float | None,
    settings: Settings,
) -> Outage:
    """The run gives up calling `model` for now: open the outage, or count its failed probe."""
    row = statements.first(
        session,
        "outage_gave_up",
        model=model,
        run_id=run_id,
        error=error,
        after=retry_after or 0.0,
        first=min(FIRST_PROBE_SECONDS, settings.model_probe_max_seconds),
        cap=settings.model_probe_max_seconds,
    )
    assert row is not None  # an INSERT or its ON CONFLICT UPDATE: one row either way
    return Outage(
        row.model, row.since, row.probe_run_id, row.recovered_at is not None, row.last_error
    )


# -- the tick --------------------------------------------------------------------------------


def _waits_on_outage() -> ColumnElement[bool]:
    """The run waits on the outage of the correlated model_outages row."""
    return Run.waiting_on == func.concat(literal(MODEL_WAIT_PREFIX), ModelOutage.model)


def tend_outages_txn(session: Session, settings: Settings) -> list[uuid.UUID]:
    """The tick's part: end outages whose probe got a reply, send the probes that are due,
    wake a pace's worth of the runs that waited, forget outages nobody waits on. Returns the
    runs woken."""
    _recovered_txn(session)
    woken = _send_probes_txn(session, settings)
    pace = math.ceil(settings.model_resume_per_second * settings.tick_seconds)
    woken += _resume_txn(session, max(1, pace))
    statements.execute(session, "forget_recovered_outages", prefix=MODEL_WAIT_PREFIX)
    return woken


def _recovered_txn(session: Session) -> None:
    """The provider answers again once the probe's reply (or a cut-off one) is journaled."""
    statements.execute(session, "outages_recovered")


def _send_probes_txn(session: Session, settings: Settings) -> list[uuid.UUID]:
    """For each open outage whose probe is due and none in flight: wake its longest-waiting
    run to make the one probe; an outage with no run waiting on it is over."""
    due = session.scalars(
        select(ModelOutage)
        .where(
            ModelOutage.recovered_at.is_(None),
            ModelOutage.probe_at <= func.now(),
            or_(ModelOutage.probe_until.is_(None), ModelOutage.probe_until < func.now()),
        )
        .with_for_update(skip_locked=True)
    ).all()
    woken: list[uuid.UUID] = []
    probe_seconds = settings.handoff_grace_seconds + settings.model_timeout_seconds
    for outage in due:
        prober = session.scalar(
            select(Run.id)
            .where(Run.status == RunStatus.WAITING, Run.waiting_on == str(model_wait(outage.model)))
            .order_by(Run.updated_at)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        if prober is None:
            statements.execute(session, "forget_outage", model=outage.model)
            continue
        woken += wake_txn(session, [prober])
        statements.execute(
            session, "outage_probe_sent", model=outage.model, run_id=prober, seconds=probe_seconds
        )
    return woken


def _resume_txn(session: Session, pace: int) -> list[uuid.UUID]:
    """Wake at most `pace` runs waiting on a model that is not (or no longer) down, longest
    waiting first: a thousand runs parked on one outage do not all call at once."""
    still_down = exists().where(ModelOutage.recovered_at.is_(None), _waits_on_outage())
    ready = (
        select(Run.id)
        .where(
            Run.status == RunStatus.WAITING,
            Run.waiting_on.startswith(MODEL_WAIT_PREFIX, autoescape=True),
            ~still_down,
        )
        .order_by(Run.updated_at)
        .limit(pace)
        .with_for_update(skip_locked=True)
    )
    return wake_txn(session, session.scalars(ready).all())
