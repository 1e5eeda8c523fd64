"""Poison runs stop: a step that kills its worker, or always overruns its time bound, fails its
run after the agent's max_step_attempts (reason crashed_worker or time_limit) instead of being
re-sent for ever, and the runs that shared the killed process finish."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from models import Run, RunStatus
from pipeline.chaos.poison import AGENT_PATH
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for, wait_for_status

SLOW_ONCE = "tests.fixture_hangs:SLOW_ONCE"
SLOW_THRICE = "tests.fixture_hangs:SLOW_THRICE"
GOOD_RUNS = 15
GOOD_STEP_SECONDS = 2.0
"""How long a good run's first step takes: in flight whenever the poison run kills."""
LIMIT = 3  # the default max_step_attempts


def runs() -> list[Run]:
    with transaction() as session:
        return list(session.scalars(select(Run)))


def lost_on(run: Run, pids: set[int]) -> list[dict[str, Any]]:
    """The failed attempts of the run's step 0 that a killed worker (one of `pids`) took."""
    if run.failed_step != 0:
        return []
    return [f for f in run.failures if any(f":{pid}:" in str(f.get("worker")) for pid in pids)]


@pytest.mark.timeout(360)
def test_a_run_whose_tool_kills_its_worker_fails_and_its_neighbours_finish(
    db_url: str,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # given one threads-pool worker with room for 16 steps at once, and beat for the tick
    register_agents(SLOW_ONCE, AGENT_PATH)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the agents' scripts are the model
    monkeypatch.setenv("SLOW_SECONDS", str(GOOD_STEP_SECONDS))
    get_settings.cache_clear()
    processes("beat", beat=True)
    workers = [processes("w0", pool="threads", concurrency=16)]

    # when 15 good runs start, each with a first step of 2 s, and then one poison run (its tool
    # SIGKILLs the worker) lands among them while they are in flight
    good = [start_run("slow_once", {"word": f"w{n}"}).run_id for n in range(GOOD_RUNS)]
    poison = start_run("poison", {"n": 7}).run_id

    # and the worker is restarted whenever it dies, as a supervisor would
    def settled() -> bool:
        if workers[-1].exited():
            assert len(workers) <= LIMIT + 1, "the worker was killed more than the limit"
            workers.append(processes(f"w{len(workers)}", pool="threads", concurrency=16))
        return all(run.status.is_terminal() for run in runs())

    wait_for(settled, timeout=300, interval=0.5, what="every run to finish")

    # then the poison run failed crashed_worker after its limit, naming step and workers
    row = wait_for_status(poison, {RunStatus.FAILED.value})
    assert row.stop_reason == "crashed_worker"
    assert row.failed_attempts == LIMIT
    assert f"step 0 failed {LIMIT} attempts in a row" in row.error
    killed = [worker for worker in workers if worker.exited()]
    assert len(killed) == LIMIT
    assert all(f":{worker.pid}:" in row.error for worker in killed), row.error
    assert main(["show", str(poison)]) == 0
    shown = capsys.readouterr().out
    assert "reason crashed_worker" in shown and f"step 0 failed {LIMIT} attempts" in shown

    # and good runs were in flight when the poison run killed their process: their step was
    # lost with it (a failed attempt on a killed worker), yet each was resumed and succeeded;
    # only its first loss counted (a later one came while the poison run held the quarantine)
    by_id = {run.id: run for run in runs()}
    pids = {worker.pid for worker in killed}
    interrupted = [by_id[run_id] for run_id in good if lost_on(by_id[run_id], pids)]
    assert len(interrupted) >= GOOD_RUNS // 3, [(r.input, r.failures) for r in interrupted]
    assert {by_id[run_id].status for run_id in good} == {RunStatus.SUCCEEDED}
    assert all(run.failed_attempts == 1 for run in interrupted)
    assert all(not f["counted"] for run in interrupted for f in run.failures[1:])
    assert not any(by_id[run_id].stop_reason == "crashed_worker" for run_id in good)

    # and no run looped: each good run was claimed at most once per kill and once per step
    assert all(by_id[run_id].attempt <= 2 + LIMIT for run_id in good)


@pytest.mark.timeout(120)
def test_a_step_that_always_overruns_its_time_bound_fails_with_time_limit(
    db_url: str,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a worker whose steps have 2 s, and a tool that always takes 30 s
    register_agents(SLOW_THRICE)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("NIGHTSHIFT_STEP_TIME_LIMIT", "2")
    monkeypatch.setenv("SLOW_SECONDS", "30")
    get_settings.cache_clear()
    processes("w1", pool="threads", concurrency=4)

    # when a run calls it
    run_id = start_run("slow_thrice", {}).run_id

    # then each attempt is given up at the bound, and the third ends the run
    row = wait_for_status(run_id, {RunStatus.FAILED.value, RunStatus.SUCCEEDED.value}, 60)
    assert (row.status, row.stop_reason) == (RunStatus.FAILED, "time_limit")
    assert row.failed_attempts == LIMIT
    assert f"step 0 failed {LIMIT} attempts in a row (it overran the step's time limit)" in (
        row.error
    )
    assert row.attempt == LIMIT + 1  # three given up, the fourth claim failed the run
