"""Model provider outages as people read them: which model is down, since when, how many runs
wait on it, when the next probe goes out and when the waiting runs give up."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, literal, select
from sqlalchemy.orm import Session

from models import ModelOutage, Run, RunStatus
from pipeline.db import read_only
from pipeline.keys import MODEL_WAIT_PREFIX
from pipeline.settings import Settings


@dataclass(frozen=True)
class OutageView:
    model: str
    since: datetime
    waiting: int
    """Runs parked on this model now."""
    probe_at: datetime
    probing: bool
    """A probe is in flight."""
    recovered_at: datetime | None
    last_error: str
    gives_up_at: datetime

    def describe(self) -> str:
        """One line for `nightshift runs`: what waits, since when, and what happens next."""
        since = f"{self.since.astimezone(UTC):%H:%M:%S} UTC"
        head = (
            f"{self.waiting} run(s) wait on the model provider ({self.model}), down since {since}"
        )
        if self.recovered_at is not None:
            return f"{head}; it answers again, the runs are resuming a few at a time"
        probe = "a probe is in flight" if self.probing else (
            f"next probe at {self.probe_at.astimezone(UTC):%H:%M:%S} UTC"
        )  # fmt: skip
        gives_up = f"{self.gives_up_at.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
        return f"{head}; {probe}; they fail model_unavailable at {gives_up} ({self.last_error})"


def model_outages_txn(session: Session, settings: Settings) -> list[OutageView]:
    waiting = (
        select(func.count())
        .where(
            Run.status == RunStatus.WAITING,
            Run.waiting_on == func.concat(literal(MODEL_WAIT_PREFIX), ModelOutage.model),
        )
        .scalar_subquery()
    )
    horizon = timedelta(seconds=settings.model_outage_horizon_seconds)
    rows = session.execute(select(ModelOutage, waiting).order_by(ModelOutage.since)).all()
    return [
        OutageView(
            model=outage.model,
            since=outage.since,
            waiting=count,
            probe_at=outage.probe_at,
            probing=outage.probe_run_id is not None,
            recovered_at=outage.recovered_at,
            last_error=outage.last_error[:200],
            gives_up_at=outage.since + horizon,
        )
        for outage, count in rows
    ]


def model_outages(settings: Settings) -> list[OutageView]:
    with read_only() as session:
        return model_outages_txn(session, settings)
