"""The competitor monitor, end to end with real workers: thirty children, one worker killed
mid-batch, one price page gone for good; the synthesis runs once and names the failure, and
each proposed price change happens once however often it is approved."""

from __future__ import annotations

import json
import re
import threading
import uuid
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import func, select

from models import Action, ActionState, Batch, BatchStatus, JournalEntry, Run, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.runs.decisions import Decision, DecisionResult, decide
from pipeline.runs.schedules import fire
from pipeline.sandbox.pricing import PricingSandbox
from pipeline.slots import Overlap, Schedule
from tests.integration.api_fixtures import PRICING_ACTOR
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import artifact_text, run_row, wait_for, wait_for_status

NEW_YORK = ZoneInfo("America/New_York")
MONITOR = Schedule(
    name="competitor-monitor", agent="competitor_monitor", hour="2", timezone=NEW_YORK,
    params={"token_cap": 5_000_000}, overlap=Overlap.CANCEL_OTHER,
)  # fmt: skip
NIGHT = datetime(2026, 11, 30, 8, tzinfo=UTC)  # 03:00 in New York: the 02:00 slot is due
KILLED_AT = re.compile(
    r"\[run=([0-9a-f-]{36}) step=(\d+) agent=\w+ worker=[^\]]+\] crash point \w+: killing"
)
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value}


def children(batch_id: str) -> list[Run]:
    with transaction() as session:
        query = select(Run).where(Run.batch_id == batch_id).order_by(Run.idempotency_key)
        return list(session.scalars(query))


def journal(run_id: uuid.UUID) -> list[tuple[int, str]]:
    with transaction() as session:
        rows = session.execute(
            select(JournalEntry.id, JournalEntry.key)
            .where(JournalEntry.run_id == run_id)
            .order_by(JournalEntry.id)
        )
        return [(row.id, row.key) for row in rows]


def synthesis_of(batch_id: str) -> uuid.UUID | None:
    with transaction() as session:
        return session.scalar(select(Batch.synthesis_run_id).where(Batch.id == batch_id))


def step_killed_at(log: str) -> tuple[uuid.UUID, int]:
    """The run and step a worker's crash point killed it in, as its last line names them."""
    run_id, step = KILLED_AT.findall(log)[-1]
    return uuid.UUID(run_id), int(step)


def pending_approvals(run_id: uuid.UUID) -> list[str]:
    with transaction() as session:
        query = select(Action.idempotency_key).where(
            Action.run_id == run_id, Action.state == ActionState.PENDING_APPROVAL
        )
        return list(session.scalars(query.order_by(Action.created_at, Action.idempotency_key)))


def approve_twice_at_once(key: str) -> list[DecisionResult]:
    results: list[DecisionResult] = []
    barrier = threading.Barrier(2)

    def approve() -> None:
        barrier.wait()
        results.append(decide(key, Decision.APPROVE, PRICING_ACTOR))

    threads = [threading.Thread(target=approve) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_a_night_of_thirty_competitors_with_a_killed_worker_and_a_dead_page(
    sandbox: Sandbox,
    pricing: PricingSandbox,
    processes: ProcessFactory,
    capsys: pytest.CaptureFixture[str],
    duplicate_report: list[int],
) -> None:
    # given thirty competitors, one of whose price pages is gone for good, and a model that
    # takes a moment per reply (so the batch is still going when the second worker comes)
    sandbox.web.fail("/competitors/c07/prices", 404, times=-1)
    sandbox.messages.delay_seconds = 0.3
    processes("beat", beat=True)
    steady = processes("steady", concurrency=2)

    # when the 02:00 slot fires and, a few children in, a second worker starts that dies right
    # after journaling its first model reply (SIGKILL at a crash point, before the tool call;
    # a step's last tool result is journaled with its checkpoint, so no crash falls between)
    batch_id = fire(MONITOR.name, now=NIGHT, schedules=[MONITOR]).batch_id
    assert batch_id is not None
    doomed = processes(
        "doomed", concurrency=1, env={"NIGHTSHIFT_CRASH_POINTS": "after_model_journaled"}
    )
    wait_for(doomed.exited, timeout=60, what="the doomed worker to die at its first reply")
    victim_id, victim_step = step_killed_at(doomed.log())
    victim = run_row(victim_id)
    assert victim.agent == "competitor_monitor", "the worker died in the middle of the batch"

    # then every child finishes and the synthesis starts once, waiting for the first approval
    synthesis_id = wait_for(lambda: synthesis_of(batch_id), timeout=90,
                            what="the synthesis to start")  # fmt: skip
    wait_for_status(synthesis_id, {RunStatus.WAITING.value}, timeout=60)
    runs = children(batch_id)
    assert len(runs) == 30
    assert all(run.status == RunStatus.SUCCEEDED for run in runs), [
        (run.input["competitor"], run.status, run.error) for run in runs
    ]

    # and each child ran from its checkpoints: no journal entry written twice, no step redone
    for run in runs:
        keys = [key for _, key in journal(run.id)]
        assert keys == ["model:0", "tool:toolu_s000_0", "model:1"], (run.input, keys)
    assert run_row(victim.id).fence >= 2, "another worker took the interrupted child over"
    # the worker that took it over continued at the interrupted step, from the journal
    context = rf"\[run={victim.id} step={victim_step} [^\]]+\] "
    assert re.search(context + "model reply replayed from the journal", steady.log())
    requests = sandbox.web.requests()
    victim_page = f"/competitors/{victim.input['competitor']}/prices"
    assert requests[victim_page] == 1, "the journaled reply's tool call ran once, after it"
    assert all(requests[f"/competitors/{r.input['competitor']}/prices"] == 1 for r in runs)
    # two model calls per child and one for each synthesis step so far: none was repeated
    assert sandbox.messages.stats()["requests"] == 30 * 2 + 3

    # and the operator sees the night at a glance
    assert main(["batches", "show", batch_id]) == 0
    shown = capsys.readouterr().out
    assert f"[{'#' * 30}] 30/30 finished" in shown
    assert "done 30  running 0  waiting 0  failed 0" in shown
    assert f"synthesis waiting on approval:price_synthesis:sku-2:{batch_id}" in shown
    pending = pending_approvals(synthesis_id)
    first = f"price_synthesis:sku-2:{batch_id}"
    assert f"pending approvals {len(pending)}\n  {first}  (set_price " in shown
    assert "  by pricing@example.com\n" in shown  # whom to approve as
    assert "nightshift approve KEY --as APPROVER" in shown
    assert main(["batches", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [b["id"] for b in listed] == [batch_id]
    assert listed[0]["status"] == "synthesizing" and listed[0]["children"]["done"] == 30

    # when the pricing manager approves each proposal in the morning, every approval twice
    approved: list[str] = []
    while wait_for_status(synthesis_id, {RunStatus.WAITING.value} | DONE).status == "waiting":
        pending = pending_approvals(synthesis_id)
        assert pending, run_row(synthesis_id).waiting_on
        for key in pending:
            results = approve_twice_at_once(key)
            assert sorted(r.first for r in results) == [False, True]
            approved.append(key)
        wait_for(lambda: run_row(synthesis_id).waiting_on != f"approval:{approved[-1]}",
                 timeout=30, what="the synthesis to move past the approval")  # fmt: skip

    # then each price changed exactly once, and the summary names the failed competitor
    synthesis = wait_for_status(synthesis_id, DONE, timeout=30)
    assert synthesis.status == RunStatus.SUCCEEDED, synthesis.error
    assert sorted(approved) == [f"price_synthesis:sku-{n}:{batch_id}" for n in (2, 3)]
    for key in approved:
        duplicate_report.append(len(pricing.changes(key)) - 1)
        assert len(pricing.changes(key)) == 1
    assert len(pricing.changes()) == 2
    assert pricing.price("sku-2")["price"] == 50.59  # type: ignore[index]
    assert pricing.price("sku-3")["price"] == 133.45  # type: ignore[index]
    summary = artifact_text(synthesis_id, synthesis.state["artifacts"]["summary"]["id"])
    assert "Failed competitors (1):\n- Granite Supply (c07): " in summary
    assert "HTTP 404" in summary
    assert "Granite Supply (c07)" in synthesis.result["text"]
    assert "sku-2 set to 50.59; sku-3 set to 133.45" in synthesis.result["text"]
    with transaction() as session:
        syntheses = session.scalars(select(Run).where(Run.agent == "price_synthesis")).all()
        batch = session.get(Batch, batch_id)
        assert [s.idempotency_key for s in syntheses] == [f"{batch_id}:synthesis"]
        assert batch is not None and batch.status == BatchStatus.SUCCEEDED
        total = session.scalar(select(func.count()).select_from(JournalEntry))
        distinct = session.scalar(
            select(func.count()).select_from(
                select(JournalEntry.run_id, JournalEntry.key).distinct().subquery()
            )
        )
    assert total == distinct
    assert sandbox.messages.stats()["requests"] == 30 * 2 + 4
