"""Batch budgets with real workers: a token cap hit mid-batch stops the rest of the batch with
reason `budget`, raises one alert for the batch, not one per child, and the batch still ends
with one synthesis, marked partial: of no child when none had finished, of the children that
finished when a cap stopped the last ones."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from sqlalchemy import func, select

from models import Alert, Batch, BatchStatus, Run, RunStatus, tokens_used
from pipeline.db import transaction
from pipeline.runs.decisions import Decision, decide
from pipeline.runs.schedules import fire
from pipeline.sandbox.pricing import PricingSandbox
from pipeline.sandbox.web import competitors
from pipeline.slots import Schedule
from tests.integration.api_fixtures import PRICING_ACTOR
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.integration.test_batches import pending_approvals
from tests.support import artifact_text, run_row, wait_for, wait_for_status

CAP = 4_000
"""Each child's first model call uses about 300 tokens: the cap is hit about halfway through
the batch's first round of calls (every child's first step is queued before any second one)."""
MONITOR = Schedule(
    name="competitor-monitor", agent="competitor_monitor", hour="2",
    timezone=ZoneInfo("America/New_York"), params={"token_cap": CAP},
)  # fmt: skip
NIGHT = datetime(2026, 11, 30, 8, tzinfo=UTC)


DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}


def children(batch_id: str) -> list[Run]:
    with transaction() as session:
        return list(session.scalars(select(Run).where(Run.batch_id == batch_id)))


def all_finished(batch_id: str) -> bool:
    return all(run.status.is_terminal() for run in children(batch_id))


def run_the_night(schedule: Schedule, processes: ProcessFactory) -> str:
    """Beat and a worker; the schedule's 02:00 slot fired and run until every child finished
    or stopped and the batch joined them (its synthesis starts once the last child's finish
    committed). Returns the batch."""
    processes("beat", beat=True)
    processes("w1", concurrency=4)
    batch_id = fire(schedule.name, now=NIGHT, schedules=[schedule]).batch_id
    assert batch_id is not None
    wait_for(lambda: all_finished(batch_id), timeout=120, what="every child to finish or stop")
    wait_for(lambda: joined(batch_id), timeout=30, what="the batch to start its synthesis")
    return batch_id


def joined(batch_id: str) -> bool:
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        return batch is not None and batch.synthesis_run_id is not None


def stopped_batch(batch_id: str, reason: str) -> Batch:
    """The batch, which a cap stopped for `reason`."""
    with transaction() as session:
        batch = session.get(Batch, batch_id)
    assert batch is not None and (batch.status, batch.stop_reason) == (BatchStatus.STOPPED, reason)
    return batch


def test_a_token_cap_hit_mid_batch_stops_the_rest_with_one_alert(
    pricing: PricingSandbox, processes: ProcessFactory
) -> None:
    # given a 30-competitor batch whose token cap runs out about halfway through it, when the
    # workers run it until nothing is left to run
    batch_id = run_the_night(MONITOR, processes)

    # then the batch stopped for its budget, and every child stopped before its next call:
    # some had read their prices, the others had not begun
    runs = children(batch_id)
    assert len(runs) == 30
    assert {(run.status, run.stop_reason) for run in runs} == {(RunStatus.FAILED, "budget")}
    begun = [run for run in runs if run.input_tokens + run.cache_creation_input_tokens > 0]
    assert 0 < len(begun) < 30, "the cap is hit mid-way"
    synthesis_id = stopped_batch(batch_id, "budget").synthesis_run_id
    assert synthesis_id is not None, "a stopped batch still gets its (partial) synthesis"
    with transaction() as session:
        used = session.scalar(select(func.sum(tokens_used())).where(Run.batch_id == batch_id))
        alerts = session.execute(select(Alert.kind, Alert.subject, Alert.message)).all()
    assert used is not None and used >= CAP
    # and exactly one alert was raised, for the batch
    assert [(a.kind, a.subject) for a in alerts] == [("budget_budget", f"batch:{batch_id}")]
    assert f"its cap is {CAP}" in alerts[0].message

    # and one partial synthesis of the children that finished says what stopped and why
    synthesis = wait_for_status(synthesis_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value})
    assert synthesis.status == RunStatus.SUCCEEDED, synthesis.error
    assert synthesis.input["stopped"]["reason"] == "budget"
    assert len(synthesis.input["stopped"]["stopped"]) == 30
    note = synthesis.result["text"]
    assert note.startswith("PARTIAL: the batch was stopped (budget: ") and "30 stopped" in note
    with transaction() as session:
        syntheses = session.scalar(
            select(func.count()).where(Run.idempotency_key.like("%synthesis"))
        )
        final = session.get(Batch, batch_id)
        assert final is not None and final.status == BatchStatus.STOPPED
    assert syntheses == 1


def approve_until_done(run_id: uuid.UUID) -> Run:
    """Approve each price change the synthesis proposes until it ends."""

    def done() -> Run | None:
        for key in pending_approvals(run_id):
            decide(key, Decision.APPROVE, PRICING_ACTOR)
        row = run_row(run_id)
        return row if row.status.is_terminal() else None

    return wait_for(done, timeout=90, interval=0.5, what="the synthesis to end")


def test_a_cap_that_stops_the_last_children_leaves_a_partial_synthesis_of_the_finished(
    sandbox: Sandbox, pricing: PricingSandbox, processes: ProcessFactory
) -> None:
    # given 30 competitors, one of whose price pages keeps failing (its child fetches it again
    # after each failure, up to three times), and a batch allowed 31 tool calls: one fetch for
    # each child, and one more
    failing = competitors()[11]
    sandbox.web.fail(f"/competitors/{failing['id']}/prices", 503, times=-1)
    capped = dataclasses.replace(MONITOR, params={"tool_call_cap": 31})

    # when the 02:00 slot fires and the workers run the batch until nothing is left to run
    batch_id = run_the_night(capped, processes)

    # then the children that read their prices finished, and the cap stopped the failing one
    # before its third fetch
    runs = children(batch_id)
    finished = {r.input["competitor"]: r for r in runs if r.status == RunStatus.SUCCEEDED}
    stopped = [r for r in runs if r.status != RunStatus.SUCCEEDED]
    assert {(r.status, r.stop_reason) for r in stopped} == {(RunStatus.FAILED, "budget")}
    assert failing["id"] in {r.input["competitor"] for r in stopped}
    assert len(finished) >= 20, "the cap came after most children had finished"
    assert sum(r.tool_calls for r in runs) == 31
    synthesis_id = stopped_batch(batch_id, "budget").synthesis_run_id
    assert synthesis_id is not None

    # and the one synthesis is told what finished, with the finished children's results, what
    # was stopped and why
    synthesis = run_row(synthesis_id)
    told = synthesis.input["stopped"]
    assert told["reason"] == "budget" and "made 31 tool calls; its cap is 31" in told["why"]
    assert told["finished"] == len(finished)
    assert sorted(i["competitor"] for i in told["stopped"]) == sorted(
        r.input["competitor"] for r in stopped
    )
    results = {c["item"]["competitor"]: c["result"] for c in synthesis.input["children"]}
    assert all(results[c] == run.result["text"] for c, run in finished.items())

    # and its summary has the finished competitors' prices and names the stopped ones
    synthesis = wait_for_status(synthesis_id, {RunStatus.WAITING.value, *DONE})
    summary = artifact_text(synthesis_id, synthesis.state["artifacts"]["summary"]["id"])
    assert f"Competitors read: {len(finished)} of 30." in summary and "| SKU |" in summary
    assert f"- {failing['name']} ({failing['id']}): the run failed (budget): " in summary

    # and, once its proposals are decided, it ends saying it is partial, what stopped and why
    ended = approve_until_done(synthesis_id)
    assert ended.status == RunStatus.SUCCEEDED, ended.error
    note = ended.result["text"]
    assert note.startswith(
        f"PARTIAL: the batch was stopped (budget: batch {batch_id} made 31 tool calls; its cap "
        f"is 31); {len(finished)} competitor(s) finished, {len(stopped)} stopped: "
    ), note
    assert failing["name"] in note
    with transaction() as session:
        syntheses = session.scalar(
            select(func.count()).where(Run.idempotency_key.like("%synthesis"))
        )
    assert syntheses == 1
