"""A night of many children through the schedule path, the fan-out and real workers: the
synthesis's input (every child's outcome) grows with the batch past what a caller may send
(NIGHTSHIFT_MAX_INPUT_BYTES), and the synthesis still starts once and ends the batch."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from models import Batch, BatchStatus, Run
from pipeline.db import transaction
from pipeline.errors import InputTooLarge
from pipeline.runs.schedules import fire
from pipeline.runs.start import start_run
from pipeline.slots import Missed, Overlap, Schedule
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for

LIMIT = 2_000
"""Bytes a caller's input may have here: less than forty children's outcomes take."""
NIGHT = Schedule(
    name="bench-night", agent="bench", minute="*", params={"children": 40, "steps": 1},
    missed=Missed.SKIP, overlap=Overlap.ALLOW,
)  # fmt: skip


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
