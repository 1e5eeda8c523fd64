"""An agent from outside nightshift's package, registered only through NIGHTSHIFT_AGENTS, is
started, run by a real worker and scheduled by beat; a worker that does not know an agent
leaves its steps to one that does, and a run no worker knows fails with a clear reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select

from models import Run, RunStatus
from pipeline.db import transaction
from pipeline.processes.celery_process import wait_for
from pipeline.runs.start import start_run
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for_status

DONE = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
ECHO = "tests.fixture_agents:ECHO"


def test_an_agent_from_outside_the_package_runs_on_a_real_worker(
    db_url: str, processes: ProcessFactory, register_agents: Callable[..., None]
) -> None:
    # given an agent in a module of its own, registered only through NIGHTSHIFT_AGENTS
    register_agents(ECHO)
    processes("w1")
    # when a run of it is started
    run_id = start_run("echo_outside", {"word": "night"}).run_id
    # then a worker runs it to the end with its own tool
    row = wait_for_status(run_id, DONE)
    assert row.status is RunStatus.SUCCEEDED, row.error
    assert row.result["text"] == 'Heard: {"loud": "NIGHT"}'


def test_beat_fires_a_schedule_naming_the_outside_agent(
    db_url: str,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    tmp_path: Path,
) -> None:
    # given a per-minute schedule naming the outside agent (the shipped schedules off)
    register_agents(ECHO)
    path = tmp_path / "schedules.json"
    entries = [{"name": "echo-minutely", "agent": "echo_outside", "minute": "*",
                "params": {"word": "slot"}, "missed": "skip", "overlap": "allow"}]  # fmt: skip
    entries += [
        {"name": name, "enabled": False}
        for name in ("nightly-report-ops", "competitor-monitor", "invoice-reminders")
    ]
    path.write_text(json.dumps(entries))
    env = {"NIGHTSHIFT_SCHEDULES_FILE": str(path), "NIGHTSHIFT_SCHEDULE_CHECK_SECONDS": "1"}
    processes("w1", env=env)
    processes("beat", beat=True, env=env)

    # then beat's check starts the current slot's run (the default job: params as input)
    def started() -> Run | None:
        with transaction() as session:
            return session.scalar(select(Run).where(Run.agent == "echo_outside"))

    run = wait_for(started, timeout=30, what="the schedule's run")
    assert run.input == {"word": "slot"} and run.idempotency_key.startswith("echo-minutely:")
    row = wait_for_status(run.id, DONE)
    assert row.status is RunStatus.SUCCEEDED, row.error


def test_a_worker_without_the_agent_leaves_its_steps_to_one_that_has_it(
    db_url: str, processes: ProcessFactory, register_agents: Callable[..., None]
) -> None:
    # given a stock worker that has already been handed the runs of an agent it does not know
    register_agents(ECHO)
    stock = processes("stock", env={"NIGHTSHIFT_AGENTS": ""})
    run_ids = [start_run("echo_outside", {"word": f"w{i}"}).run_id for i in range(3)]
    wait_for(lambda: "is not registered here" in stock.log(), timeout=30, what="a hand-off")
    # when a worker that knows the agent joins
    processes("knows")
    # then every run succeeds, none failed by the stock worker
    for run_id in run_ids:
        row = wait_for_status(run_id, DONE)
        assert row.status is RunStatus.SUCCEEDED, row.error


def test_a_run_no_worker_knows_fails_with_a_clear_reason(
    db_url: str, processes: ProcessFactory, register_agents: Callable[..., None]
) -> None:
    # given only a stock worker, which hands such a step on for 10 s
    register_agents(ECHO)
    processes("stock", env={"NIGHTSHIFT_AGENTS": "", "NIGHTSHIFT_UNKNOWN_AGENT_SECONDS": "10"})
    # when a run of an agent only this process knows is started
    run_id = start_run("echo_outside", {"word": "lost"}).run_id
    # then it is handed on a bounded number of times and fails, saying why and where
    row = wait_for_status(run_id, DONE, timeout=90)
    assert (row.status, row.stop_reason) == (RunStatus.FAILED, "unknown_agent")
    assert "unknown agent on this worker" in row.error and "echo_outside" in row.error
