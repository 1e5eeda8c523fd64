"""Gauges read from the database at scrape time, each from a bounded query: only unfinished
runs, open actions and open takeovers are counted, through indexes, so the cost of a scrape
does not grow with the number of finished runs kept. Plus the broker's queue lengths."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import Action, ActionKind, ActionState, Resumption, Run, RunStatus
from pipeline.db import read_only
from pipeline.settings import Settings
from pipeline.views.liveness import queue_liveness_txn
from pipeline.views.metrics import queue_lengths
from pipeline.views.outages import model_outages_txn

ACTIVE = (RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION)
OPEN_ACTIONS = (
    ActionState.PENDING_APPROVAL,
    ActionState.INTENDED,
    ActionState.ATTEMPTED,
    ActionState.OUTCOME_UNKNOWN,
)


class DatabaseGauges(Collector):
    """A prometheus_client collector: one read-only transaction per scrape."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with read_only() as session:
            families = list(self._from_database(session))
        yield from families
        depth = GaugeMetricFamily(
            "nightshift_queue_depth", "Messages waiting in the broker queue.", labels=["queue"]
        )
        lengths = queue_lengths(self.settings, [self.settings.queue, self.settings.control_queue])
        for queue, length in (lengths or {}).items():
            depth.add_metric([queue], length)
        yield depth

    def _from_database(self, session: Session) -> Iterator[GaugeMetricFamily]:
        runs = GaugeMetricFamily(
            "nightshift_runs_active",
            "Unfinished runs by agent and status (running, waiting, needs_attention).",
            labels=["agent", "status"],
        )
        counted = session.execute(
            select(Run.agent, Run.status, func.count())
            .where(Run.status.in_(ACTIVE))
            .group_by(Run.agent, Run.status)
        )
        for agent, status, count in counted:
            runs.add_metric([agent, str(status)], count)
        yield runs

        actions = GaugeMetricFamily(
            "nightshift_actions_open",
            "Side effects not settled yet, by state (pending_approval, intended, attempted, "
            "outcome_unknown).",
            labels=["state"],
        )
        by_state = dict(
            session.execute(
                select(Action.state, func.count())
                .where(Action.state.in_(OPEN_ACTIONS), Action.kind == ActionKind.TOOL)
                .group_by(Action.state)
            ).all()
        )
        for state in OPEN_ACTIONS:
            actions.add_metric([state.value], by_state.get(state, 0))
        yield actions

        oldest = session.scalar(
            select(func.extract("epoch", func.now() - func.min(Run.updated_at))).where(
                Run.status == RunStatus.RUNNING, Run.lease_owner.is_(None)
            )
        )
        yield GaugeMetricFamily(
            "nightshift_oldest_unclaimed_seconds",
            "How long the longest-waiting runnable run has gone without a worker claiming it "
            "(0 when none waits).",
            value=float(oldest or 0),
        )
        open_takeovers = session.scalar(
            select(func.count()).select_from(Resumption).where(Resumption.resumed_at.is_(None))
        )
        yield GaugeMetricFamily(
            "nightshift_resumptions_open",
            "Runs found without a live worker and not yet claimed again.",
            value=int(open_takeovers or 0),
        )
        yield from self._outages(session)
        liveness = queue_liveness_txn(session, self.settings)
        workers = GaugeMetricFamily(
            "nightshift_workers_alive",
            "Workers with a recent heartbeat that consume the step queue.",
            labels=["queue"],
        )
        workers.add_metric([self.settings.queue], len(liveness.alive))
        yield workers

    def _outages(self, session: Session) -> Iterator[GaugeMetricFamily]:
        """Runs waiting on a model provider that is down, and since when (a row per model)."""
        waiting = GaugeMetricFamily(
            "nightshift_runs_waiting_on_model",
            "Runs parked until the model provider answers again, by model.",
            labels=["model"],
        )
        since = GaugeMetricFamily(
            "nightshift_model_outage_started_seconds",
            "When the model's outage began (Unix time); absent when the model is not down.",
            labels=["model"],
        )
        for outage in model_outages_txn(session, self.settings):
            waiting.add_metric([outage.model], outage.waiting)
            if outage.recovered_at is None:
                since.add_metric([outage.model], outage.since.timestamp())
        yield waiting
        yield since
