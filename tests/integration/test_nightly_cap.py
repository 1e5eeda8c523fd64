"""The nightly cap covers every run of the night, whatever started it: a run started with
`.delay()` and one started by a schedule both stop when the night's tokens reach the cap, with
one warning first and one alert for the night. A batch the nightly cap stops still ends with
one synthesis of the children that finished, marked partial, which runs past the cap."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from models import Alert, Batch, BatchStatus, Run, RunStatus
from pipeline.agent_definition import BatchPlan
from pipeline.db import transaction
from pipeline.runs.fanout import create_batch_txn
from pipeline.runs.schedules import fire
from pipeline.settings import get_settings
from pipeline.slots import Schedule
from pipeline.tasks import start_run
from tests.integration.conftest import ProcessFactory
from tests.integration.test_batches import synthesis_of
from tests.integration.test_money_budgets import children, night_zone
from tests.support import wait_for, wait_for_status

CAP = 3_000
NIGHTLY = Schedule(name="endless-nightly", agent="endless_shout", hour="2", params={"word": "b"})


@pytest.mark.timeout(180)
def test_the_nightly_token_cap_stops_delay_and_schedule_runs_alike(
    db_url: str,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a nightly cap in tokens, a warning at half of it, and runs that never finish
    register_agents("tests.fixture_agents:ENDLESS")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("NIGHTSHIFT_NIGHTLY_TOKEN_CAP", str(CAP))
    monkeypatch.setenv("NIGHTSHIFT_NIGHTLY_ALERT_AT", "0.5")
    get_settings.cache_clear()
    processes("w1", concurrency=2)

    # when one run is started by another service with .delay() and one by the schedule
    delayed = start_run.delay("endless_shout", {"word": "a"}).get(timeout=30)
    scheduled = fire(NIGHTLY.name, now=datetime.now(UTC), schedules=[NIGHTLY]).run_id
    assert scheduled is not None

    # then both stop for the night's budget, neither inside a batch
    rows = [
        wait_for_status(run_id, {RunStatus.FAILED.value}, 120) for run_id in (delayed, scheduled)
    ]
    assert {(row.stop_reason, row.batch_id) for row in rows} == {("nightly_budget", None)}
    used = sum(row.input_tokens + row.output_tokens for row in rows)
    assert used >= CAP
    assert all(f"the nightly token cap is {CAP}" in row.error for row in rows)

    # and the night had one warning and one alert
    with transaction() as session:
        alerts = session.execute(select(Alert.kind, Alert.subject)).all()
    kinds = sorted(kind for kind, _ in alerts)
    assert kinds == ["nightly_budget", "nightly_budget_warning"]
    assert len({subject for _, subject in alerts}) == 1
    assert alerts[0].subject.startswith("night:")


@pytest.mark.timeout(180)
def test_a_batch_the_nightly_cap_stops_ends_with_a_partial_synthesis_of_the_finished(
    db_url: str,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a nightly token cap, and a batch of five children: three answer at once, two only
    # after an hour on a timer
    register_agents(
        "tests.fixture_agents:NOW_OR_LATER", "tests.fixture_agents:SUM_UP",
        "tests.fixture_agents:ENDLESS",
    )  # fmt: skip
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("NIGHTSHIFT_NIGHTLY_TOKEN_CAP", str(CAP))
    monkeypatch.setenv("NIGHTSHIFT_NIGHT_TIMEZONE", night_zone())
    get_settings.cache_clear()
    processes("beat", beat=True)
    processes("w1", concurrency=2)
    items = [{"word": w} for w in ("alpha", "bravo", "charlie")]
    items += [{"word": w, "later": True} for w in ("xray", "yankee")]
    plan = BatchPlan(batch_id="night-batch", name="words", child_agent="now_or_later",
                     child_inputs=items, synthesis_agent="sum_up", params={})  # fmt: skip
    with transaction() as session:
        create_batch_txn(session, plan)

    def split() -> tuple[list[Run], list[Run]] | None:
        runs = children(plan.batch_id)
        done = [r for r in runs if r.status == RunStatus.SUCCEEDED]
        waiting = [r for r in runs if r.status == RunStatus.WAITING]
        return (done, waiting) if (len(done), len(waiting)) == (3, 2) else None

    finished, _ = wait_for(split, timeout=60, what="three children done, two on their timer")

    # when another run of the night (started with .delay()) spends the night to its cap
    spender = start_run.delay("endless_shout", {"word": "a"}).get(timeout=30)
    assert wait_for_status(spender, {RunStatus.FAILED.value}, 120).stop_reason == ("nightly_budget")

    # then the batch stopped for the night's budget, its waiting children with it
    synthesis_id = wait_for(lambda: synthesis_of(plan.batch_id), timeout=60,
                            what="the partial synthesis to start")  # fmt: skip
    with transaction() as session:
        batch = session.get(Batch, plan.batch_id)
        assert batch is not None
        assert (batch.status, batch.stop_reason) == (BatchStatus.STOPPED, "nightly_budget")
    stopped = [r for r in children(plan.batch_id) if r.status != RunStatus.SUCCEEDED]
    assert {(r.status, r.stop_reason) for r in stopped} == {(RunStatus.FAILED, "nightly_budget")}

    # and its one synthesis runs past the cap, marked partial, with the finished children's
    # results, what was stopped and why
    synthesis = wait_for_status(synthesis_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value})
    assert synthesis.status == RunStatus.SUCCEEDED, (synthesis.stop_reason, synthesis.error)
    told = synthesis.input["stopped"]
    assert (told["reason"], told["finished"]) == ("nightly_budget", 3)
    assert sorted(item["word"] for item in told["stopped"]) == ["xray", "yankee"]
    assert f"the nightly token cap is {CAP}" in told["why"]
    note = synthesis.result["text"]
    assert note.startswith("PARTIAL: the batch was stopped (nightly_budget: the runs of the night")
    stopped_words = note.split("3 finished, stopped: ", 1)[1].split(".", 1)[0]
    assert sorted(stopped_words.split(", ")) == ["xray", "yankee"], note
    for run in finished:
        assert f"{run.input['word']}: {run.result['text']}" in note
    with transaction() as session:
        syntheses = session.scalar(
            select(func.count()).where(Run.idempotency_key.like("%synthesis"))
        )
        final = session.get(Batch, plan.batch_id)
        assert final is not None and final.status == BatchStatus.STOPPED
    assert syntheses == 1
