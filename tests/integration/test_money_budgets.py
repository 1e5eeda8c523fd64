"""Money and tool-call budgets with real workers and the real SDK: a run's money cap, a batch's
tool-call cap, and a nightly cap over every batch of a night that warns first, then stops
them all, each with one alert (a row, a log line, a webhook)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select

from models import Alert, Batch, BatchStatus, JournalEntry, Run, RunStatus
from pipeline.agent_definition import BatchPlan
from pipeline.db import transaction
from pipeline.engine.usage import COUNTERS
from pipeline.runs.fanout import create_batch_txn
from pipeline.runs.start import start_run
from pipeline.sandbox.base import SandboxServer
from pipeline.sandbox.transport import Request, Response
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import wait_for, wait_for_status

RUN_INPUT = {"team": "ops", "date": "2026-11-29"}
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}
FLAT = 100.0
"""Dollars per million tokens of every kind: a call of some 400 tokens costs about $0.04."""


class AlertSink(SandboxServer):
    """Receives the alert webhook."""

    service = "alerts"

    def __init__(self, log_path: Path) -> None:
        super().__init__(log_path=log_path)
        self.route("POST", "/alerts", self._receive)

    def _receive(self, request: Request) -> Response:
        self.record(**request.json_object())
        return Response(200, {"ok": True})


@pytest.fixture
def priced(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[AlertSink]:
    """Every token at one flat, high price; alerts go to a webhook."""
    flat = {"input": FLAT, "output": FLAT, "cache_write": FLAT, "cache_read": FLAT}
    monkeypatch.setenv("NIGHTSHIFT_MODEL_PRICES", json.dumps({"claude-sonnet-4-5": flat}))
    with AlertSink(tmp_path / "alerts.jsonl") as sink:
        monkeypatch.setenv("NIGHTSHIFT_ALERT_WEBHOOK_URL", f"{sink.url}/alerts")
        yield sink


def alerts() -> list[tuple[str, str, str]]:
    with transaction() as session:
        return [tuple(row) for row in session.execute(
            select(Alert.kind, Alert.subject, Alert.message).order_by(Alert.id)
        )]  # fmt: skip


def new_batch(**caps: int) -> str:
    batch_id = f"test-{uuid.uuid4().hex[:8]}"
    plan = BatchPlan(
        batch_id=batch_id,
        name="reports",
        child_agent="nightly_report",
        child_inputs=[{"team": team, "date": "2026-11-29"} for team in ("ops", "pricing")],
        synthesis_agent="price_synthesis",
        params={},
        **caps,  # type: ignore[arg-type]
    )
    with transaction() as session:
        create_batch_txn(session, plan)
    return batch_id


def children(batch_id: str) -> list[Run]:
    with transaction() as session:
        return list(session.scalars(select(Run).where(Run.batch_id == batch_id)))


def finished(batch_id: str) -> list[Run] | None:
    runs = children(batch_id)
    return runs if all(run.status.is_terminal() for run in runs) else None


def test_a_run_stops_before_the_call_that_would_start_past_its_money_cap(
    priced: AlertSink,
    sandbox: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
) -> None:
    # given a report agent capped at $0.05 a run, and calls that cost a few cents each
    register_agents("tests.fixture_agents:CAPPED_REPORT")
    processes("w1")

    # when it runs
    run_id = start_run("capped_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=60)

    # then it recorded each call's cost and stopped before the first call past the cap
    assert (row.status, row.stop_reason) == (RunStatus.FAILED, "max_cost")
    with transaction() as session:
        replies = session.scalars(
            select(JournalEntry.payload)
            .where(JournalEntry.run_id == run_id, JournalEntry.key.like("model:%"))
            .order_by(JournalEntry.id)
        ).all()
    costs = [sum(reply["usage"][k] for k in COUNTERS) * FLAT / 1e6 for reply in replies]
    assert len(costs) == row.step
    assert sum(costs[:-1]) < 0.05 <= sum(costs) == pytest.approx(row.cost_usd)
    kind, subject, message = alerts()[0]
    assert (kind, subject) == ("budget_max_cost", f"run:{run_id}")
    assert "the limit is $0.0500" in message
    # and its webhook went out once (sent by the worker's senders, after the stop's commit)
    delivered = wait_for(priced.log.entries, timeout=30, what="the alert's webhook")
    assert [(e["kind"], e["subject"]) for e in delivered] == [(kind, subject)]


def test_a_batch_stops_at_its_tool_call_cap(
    priced: AlertSink, sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given a batch of two reports (five tool calls each) allowed three tool calls in all
    processes("w1", concurrency=1)
    batch_id = new_batch(tool_call_cap=3)

    # when the worker runs it
    runs = wait_for(lambda: finished(batch_id), timeout=60, what="the batch to stop")

    # then the batch stopped before its fourth tool call, and said so once
    assert {(run.status, run.stop_reason) for run in runs} == {(RunStatus.FAILED, "budget")}
    assert sum(run.tool_calls for run in runs) == 3
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None and (batch.status, batch.stop_reason) == (
            BatchStatus.STOPPED, "budget",
        )  # fmt: skip
    ((kind, subject, message),) = alerts()
    assert (kind, subject) == ("budget_budget", f"batch:{batch_id}")
    assert "made 3 tool calls; its cap is 3" in message


def night_zone() -> str:
    """A timezone where it is about midnight now: the night's noon boundary is hours away."""
    hour = datetime.now(UTC).hour
    return f"Etc/GMT+{hour}" if hour <= 12 else f"Etc/GMT-{24 - hour}"


def batch_cost(batch_id: str) -> float:
    with transaction() as session:
        cost = session.scalar(select(func.sum(Run.cost_usd)).where(Run.batch_id == batch_id))
    return float(cost or 0)


def test_the_nightly_cap_warns_first_then_stops_every_batch_of_the_night(
    priced: AlertSink,
    sandbox: Sandbox,
    processes: ProcessFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a first batch of the night that ran to its end
    monkeypatch.setenv("NIGHTSHIFT_NIGHT_TIMEZONE", night_zone())
    first = processes("before-the-cap")
    first_batch = new_batch()
    wait_for(lambda: finished(first_batch), timeout=60, what="the first batch")
    spent = batch_cost(first_batch)
    first.stop()

    # when a nightly cap of 1.3 times that (warning at half of it) is set, and a second
    # batch of the same size starts the same night
    monkeypatch.setenv("NIGHTSHIFT_NIGHTLY_COST_CAP_USD", f"{spent * 1.3:.6f}")
    monkeypatch.setenv("NIGHTSHIFT_NIGHTLY_ALERT_AT", "0.5")
    processes("under-the-cap")
    second_batch = new_batch()
    runs = wait_for(lambda: finished(second_batch), timeout=60, what="the second batch")

    # then the night was warned about once, and stopped once the night's spend reached the cap
    assert {(r.status, r.stop_reason) for r in runs} == {(RunStatus.FAILED, "nightly_budget")}
    assert spent * 1.3 <= spent + batch_cost(second_batch) < spent * 2
    with transaction() as session:
        batch = session.get(Batch, second_batch)
        assert batch is not None
        assert (batch.status, batch.stop_reason) == (BatchStatus.STOPPED, "nightly_budget")
    raised = alerts()
    assert [kind for kind, _, _ in raised] == ["nightly_budget_warning", "nightly_budget"]
    assert raised[0][1] == raised[1][1] and raised[0][1].startswith("night:")
    assert "of the nightly cap" in raised[0][2] and "the nightly cap is" in raised[1][2]
    # and each alert's webhook went out once (sent by the worker's senders after its commit)
    wait_for(lambda: len(priced.log.entries()) >= len(raised), timeout=30, what="the webhooks")
    webhook = [(e["kind"], e["subject"]) for e in priced.log.entries()]
    assert webhook == [(kind, subject) for kind, subject, _ in raised]
