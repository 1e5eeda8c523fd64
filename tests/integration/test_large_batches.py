"""A night of many children through the schedule path, the fan-out and real workers: the
synthesis's input (every child's outcome) grows with the batch past what a caller may send
(NIGHTSHIFT_MAX_INPUT_BYTES), and the synthesis still starts once and ends the batch; children
finishing at once do not queue on their batch's row, and nobody waits for a joiner holding
it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import func, select, text

from models import Batch, BatchStatus, Run, RunStatus
from pipeline.agent_definition import BatchPlan
from pipeline.db import conninfo, transaction
from pipeline.errors import InputTooLarge
from pipeline.runs.fanout import create_batch_txn, ready_batches_txn
from pipeline.runs.schedules import fire
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from pipeline.slots import Missed, Overlap, Schedule
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for

LIMIT = 2_000
"""Bytes a caller's input may have here: less than forty children's outcomes take."""


def night_of(children: int) -> Schedule:
    """A night of `children` one-step bench runs, fired by hand."""
    return Schedule(
        name="bench-night", agent="bench", minute="*",
        params={"children": children, "steps": 1}, missed=Missed.SKIP, overlap=Overlap.ALLOW,
    )  # fmt: skip


NIGHT = night_of(40)


def batch_status(batch_id: str) -> BatchStatus | None:
    with transaction() as session:
        return session.scalar(select(Batch.status).where(Batch.id == batch_id))


def syntheses(batch_id: str) -> list[Run]:
    with transaction() as session:
        query = select(Run).where(
            Run.agent == "bench_synthesis", Run.input["batch"].as_string() == batch_id
        )
        return list(session.scalars(query))


def test_a_synthesis_larger_than_a_request_may_be_starts_once(
    db_url: str, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a deployment whose callers may send inputs of at most 2,000 bytes, and a worker
    monkeypatch.setenv("NIGHTSHIFT_MAX_INPUT_BYTES", str(LIMIT))
    processes("worker", concurrency=4, env={"NIGHTSHIFT_MAX_INPUT_BYTES": str(LIMIT)})

    # when the night's slot fires a batch of forty children
    batch_id = fire(NIGHT.name, now=datetime.now(UTC), schedules=[NIGHT]).batch_id
    assert batch_id is not None

    # then the batch ends with one synthesis, which counted every child
    wait_for(lambda: batch_status(batch_id) == BatchStatus.SUCCEEDED, timeout=90,
             what="the batch to succeed")  # fmt: skip
    [synthesis] = syntheses(batch_id)
    assert synthesis.result["text"] == "40 children: 40 succeeded."
    assert len(json.dumps(synthesis.input).encode()) > LIMIT

    # and a caller still may not send such an input
    with pytest.raises(InputTooLarge, match="NIGHTSHIFT_MAX_INPUT_BYTES"):
        start_run("bench_synthesis", synthesis.input)


def test_finishing_children_do_not_wait_on_their_batch_row(
    db_url: str, processes: ProcessFactory
) -> None:
    # given a night of twelve children whose batch row another transaction holds (as the last
    # child does while it starts the synthesis)
    night = night_of(12)
    batch_id = fire(night.name, now=datetime.now(UTC), schedules=[night]).batch_id
    assert batch_id is not None
    with psycopg.connect(conninfo()) as holder:
        holder.execute("SET idle_in_transaction_session_timeout = 0")
        holder.execute("SELECT 1 FROM batches WHERE id = %s FOR NO KEY UPDATE", [batch_id])

        # when a worker runs them
        processes("worker", concurrency=4)

        # then every child finishes while the row is held, and the synthesis waits for it
        wait_for(lambda: finished_children(batch_id) == 12, timeout=90,
                 what="every child to finish while the batch row is held")  # fmt: skip
        assert syntheses(batch_id) == []

        # and the tick's backstop passes the held row by instead of waiting for it (ticks
        # queued behind a 100,000-child join took every connection of the workers)
        with transaction() as session:
            session.execute(text("SET LOCAL lock_timeout = '5s'"))
            assert ready_batches_txn(session) == []
        holder.rollback()

    # and once it is free, the tick starts the synthesis once, which ends the batch
    processes("beat", beat=True)
    wait_for(lambda: batch_status(batch_id) == BatchStatus.SUCCEEDED, timeout=90,
             what="the batch to succeed")  # fmt: skip
    [synthesis] = syntheses(batch_id)
    assert synthesis.result["text"] == "12 children: 12 succeeded."


def finished_children(batch_id: str) -> int:
    with transaction() as session:
        query = select(func.count()).where(
            Run.batch_id == batch_id, Run.status == RunStatus.SUCCEEDED
        )
        return int(session.scalar(query) or 0)


def test_the_tick_joins_a_batch_whose_last_child_died_before_looking(
    db_url: str, processes: ProcessFactory
) -> None:
    # given a night of one child and a worker that dies right after that child's finish
    # committed, before it looked for children left
    night = night_of(1)
    doomed = processes(
        "doomed", concurrency=1, env={"NIGHTSHIFT_CRASH_POINTS": "before_batch_join"}
    )
    batch_id = fire(night.name, now=datetime.now(UTC), schedules=[night]).batch_id
    assert batch_id is not None
    wait_for(doomed.exited, timeout=60, what="the worker to die before the join")
    assert finished_children(batch_id) == 1 and syntheses(batch_id) == []

    # when beat's tick and another worker run
    processes("beat", beat=True)
    processes("worker", concurrency=2)

    # then the tick joins the batch: one synthesis, and the batch ends
    wait_for(lambda: batch_status(batch_id) == BatchStatus.SUCCEEDED, timeout=90,
             what="the batch to succeed")  # fmt: skip
    [synthesis] = syntheses(batch_id)
    assert synthesis.result["text"] == "1 children: 1 succeeded."


IDLE_MS = text("SELECT setting FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout'")


def test_a_fan_out_may_sit_between_its_statements_a_millisecond_a_child_longer(
    db_url: str,
) -> None:
    # given the connection's own limit: one lease idle inside a transaction
    lease_ms = int(get_settings().lease_seconds * 1000)
    plan = BatchPlan(
        batch_id="idle-batch", name="idle", child_agent="nightly_report",
        child_inputs=[{"team": f"t{i}", "date": "2026-12-04"} for i in range(3000)],
        synthesis_agent="price_synthesis", params={},
    )  # fmt: skip
    with transaction() as session:
        before = session.scalar(IDLE_MS)
        # when a fan-out checks its children's inputs in its transaction
        assert len(create_batch_txn(session, plan)) == 3000
        during = session.scalar(IDLE_MS)
    with transaction() as session:
        after = session.scalar(IDLE_MS)
    # then that transaction, and only it, may wait a millisecond a child longer
    assert before == after == str(lease_ms)
    assert during == str(lease_ms + 3000)
