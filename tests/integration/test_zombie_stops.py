"""A zombie step (frozen past its lease, thawed after another holder took the run) can stop no
batch and raise no alert: the budget stop's writes are fenced like every other write of a step."""

from __future__ import annotations

import signal
import time

import psutil
from sqlalchemy import select, update

from models import Alert, Batch, BatchStatus, Run, RunStatus
from pipeline.agent_definition import BatchPlan
from pipeline.app import send_step
from pipeline.db import transaction
from pipeline.runs.fanout import create_batch_txn
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import claim, run_row, wait_for

RUN_INPUT = {"team": "ops", "date": "2026-11-29"}


def stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


def test_a_zombie_step_cannot_stop_its_batch_or_raise_an_alert(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given a batch with no tool calls left (a cap of 0: its child must stop before its first
    # tool call), and a worker that freezes right after journaling the child's first reply
    plan = BatchPlan(
        batch_id="zombie-batch", name="zombie", child_agent="nightly_report",
        child_inputs=[RUN_INPUT, {**RUN_INPUT, "team": "sales"}],
        synthesis_agent="price_synthesis", params={}, tool_call_cap=0,
    )  # fmt: skip
    zombie = processes(
        "zombie", concurrency=1, env={"NIGHTSHIFT_PAUSE_POINTS": "after_model_journaled"}
    )
    with transaction() as session:
        first, second = create_batch_txn(session, plan)
    wait_for(lambda: stopped(zombie.pid), timeout=60, what="the worker to freeze")
    frozen = next(run_id for run_id in (first, second) if run_row(run_id).lease_owner)

    # when its lease runs out and another holder takes the run over (and keeps it)
    lease = wait_for(lambda: claim(frozen, "taker", lease_seconds=300), timeout=30,
                     what="the lease to lapse")  # fmt: skip
    zombie.signal(signal.SIGCONT)

    # then the thawed step's stop is refused at its fence and rolled back
    try:  # as test_step_engine's frozen worker: once in CI not within 30 s, cause not found
        wait_for(lambda: "stopping without writing" in zombie.log(), timeout=60, what="LeaseLost")
    except TimeoutError:
        steps = "\n".join(line for line in zombie.log().splitlines() if "pipeline.tick" not in line)
        raise AssertionError(f"the thawed worker never hit LeaseLost:\n{steps[-6000:]}") from None
    assert f"fence {lease.fence - 1} is no longer current" in zombie.log()
    zombie.kill()  # it froze again in the other child: a thaw would stop the batch, rightly
    time.sleep(0.5)
    with transaction() as session:
        batch = session.get(Batch, plan.batch_id)
        assert batch is not None
        assert (batch.status, batch.stop_reason) == (BatchStatus.RUNNING, None)
        assert session.scalars(select(Alert)).all() == []
        statuses = session.execute(select(Run.id, Run.status, Run.fence)).all()
    assert {row.status for row in statuses} == {RunStatus.RUNNING}
    assert run_row(frozen).fence == lease.fence
    assert run_row(frozen).step == 0

    # and a step holding the current fence still stops the batch, once
    with transaction() as session:
        session.execute(update(Run).where(Run.id == frozen).values(lease_expires_at=None))
    worker = processes("worker")
    send_step(frozen, agent="nightly_report")
    wait_for(lambda: _batch_status(plan.batch_id) is BatchStatus.STOPPED, timeout=60,
             what="the batch to stop")  # fmt: skip
    worker.stop()
    with transaction() as session:
        alerts = session.execute(select(Alert.kind, Alert.subject)).all()
    assert [tuple(a) for a in alerts] == [("budget_budget", f"batch:{plan.batch_id}")]


def _batch_status(batch_id: str) -> BatchStatus | None:
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        return batch.status if batch is not None else None
