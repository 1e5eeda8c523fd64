"""Batch budgets with real workers: a token cap hit mid-batch stops the rest of the batch with
reason `budget` and raises one alert for the batch, not one per child."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from sqlalchemy import func, select

from models import Alert, Batch, BatchStatus, Run, RunStatus, tokens_used
from pipeline.db import transaction
from pipeline.runs.schedules import fire
from pipeline.slots import Schedule
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import wait_for

CAP = 4_000
"""Each child's first model call uses about 300 tokens: the cap is hit about halfway through
the batch's first round of calls (every child's first step is queued before any second one)."""
MONITOR = Schedule(
    name="competitor-monitor", agent="competitor_monitor", hour="2",
    timezone=ZoneInfo("America/New_York"), params={"token_cap": CAP},
)  # fmt: skip
NIGHT = datetime(2026, 11, 30, 8, tzinfo=UTC)


def children(batch_id: str) -> list[Run]:
    with transaction() as session:
        return list(session.scalars(select(Run).where(Run.batch_id == batch_id)))


def all_finished(batch_id: str) -> bool:
    return all(run.status.is_terminal() for run in children(batch_id))


def test_a_token_cap_hit_mid_batch_stops_the_rest_with_one_alert(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given a 30-competitor batch whose token cap runs out about halfway through it
    processes("beat", beat=True)
    processes("w1", concurrency=4)
    batch_id = fire(MONITOR.name, now=NIGHT, schedules=[MONITOR]).batch_id
    assert batch_id is not None

    # when the workers run it until nothing is left to run
    wait_for(lambda: all_finished(batch_id), timeout=90, what="every child to finish or stop")

    # then the batch stopped for its budget, and every child stopped before its next call:
    # some had read their prices, the others had not begun
    runs = children(batch_id)
    assert len(runs) == 30
    assert {(run.status, run.stop_reason) for run in runs} == {(RunStatus.FAILED, "budget")}
    begun = [run for run in runs if run.input_tokens + run.cache_creation_input_tokens > 0]
    assert 0 < len(begun) < 30, "the cap is hit mid-way"
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None
        assert (batch.status, batch.stop_reason) == (BatchStatus.STOPPED, "budget")
        assert batch.synthesis_run_id is None, "a stopped batch starts no synthesis"
        used = session.scalar(select(func.sum(tokens_used())).where(Run.batch_id == batch_id))
        alerts = session.execute(select(Alert.kind, Alert.subject, Alert.message)).all()
    assert used is not None and used >= CAP
    # and exactly one alert was raised, for the batch
    assert [(a.kind, a.subject) for a in alerts] == [("budget_budget", f"batch:{batch_id}")]
    assert f"its cap is {CAP}" in alerts[0].message
