"""A step's time bound holds in the threads pool, where Celery's task_time_limit does nothing:
a step whose tool hangs is given up at the bound, the run goes on in another attempt without
losing what was journaled, and the hung step's message is acknowledged, so Redis never delivers
it again while that step still runs: with the shortest visibility timeout the settings allow, a
restore sweep in the middle of the hang puts nothing back, and every step message reaches the
worker once."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from kombu import Connection
from sqlalchemy import select

from models import JournalEntry, RunStatus
from pipeline.db import transaction
from pipeline.engine.step import StepOutcome
from pipeline.runs.start import start_run
from pipeline.settings import STEP_GIVE_UP_SECONDS, get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import ServiceUrls, wait_for, wait_for_status

HANGS_ONCE = "tests.fixture_hangs:HANGS_ONCE"
TIME_LIMIT = 3
HANG_SECONDS = 35


def shortest_visibility_timeout() -> float:
    """The least NIGHTSHIFT_VISIBILITY_TIMEOUT the settings accept with this time limit."""
    lease = float(os.environ["NIGHTSHIFT_LEASE_SECONDS"])
    return TIME_LIMIT + lease + STEP_GIVE_UP_SECONDS + 1


def restore_sweep(services: ServiceUrls, visibility: float) -> None:
    """What every worker does at its start and then every 100 s (kombu's restore_visible): put
    each message delivered more than the visibility timeout ago and not acknowledged back in
    its queue, to be delivered again."""
    options = {"visibility_timeout": visibility}
    with Connection(services.broker, transport_options=options) as connection:
        connection.default_channel.qos.restore_visible(interval=1)


def deliveries(log: str) -> Counter[str]:
    """How many times the worker received each step message (by task id)."""
    return Counter(re.findall(r"Task pipeline\.step\[([0-9a-f-]+)\] received", log))


def unacked_task_ids(services: ServiceUrls) -> set[str]:
    """Task ids of the step messages Redis holds as delivered and not yet acknowledged: the
    ones it would deliver again after the visibility timeout."""
    client = redis.Redis.from_url(services.broker)
    try:
        held = client.hvals("unacked")
    finally:
        client.close()
    return {json.loads(raw)[0]["headers"]["id"] for raw in held}


@pytest.mark.timeout(120)
def test_a_step_whose_tool_hangs_is_given_up_at_its_time_limit_and_the_run_goes_on(
    db_url: str,
    services: ServiceUrls,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # given a threads-pool worker with a 3 s step time limit, a tool that hangs for 35 s, and
    # a visibility timeout short enough that Redis would deliver a held message again mid-hang
    visibility = shortest_visibility_timeout()
    marker = tmp_path / "hang-marker"
    register_agents(HANGS_ONCE)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the agent's script is the model
    for name, value in {
        "NIGHTSHIFT_STEP_TIME_LIMIT": str(TIME_LIMIT),
        "NIGHTSHIFT_VISIBILITY_TIMEOUT": str(visibility),
        "HANG_MARKER": str(marker),
        "HANG_SECONDS": str(HANG_SECONDS),
    }.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    worker = processes("w1", pool="threads", concurrency=2)

    # when a run calls that tool
    started = time.monotonic()
    run_id = start_run("hangs_once", {"word": "night"}).run_id
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}, 40)
    finished_after = time.monotonic() - started

    # then the run finished on another attempt while the first one still hung in the tool
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert row.result["text"].startswith("Found:")
    assert marker.read_text() == "hanging", "the run waited for the hung call"
    assert finished_after < HANG_SECONDS - 5
    # and the hung step's task ended at the limit: its message is acknowledged, not held
    given_up = re.findall(
        r"Task pipeline\.step\[([0-9a-f-]+)\] succeeded in ([0-9.]+)s: 'time_up'", worker.log()
    )
    assert len(given_up) == 1, worker.log()[-3000:]
    task_id, seconds = given_up[0][0], float(given_up[0][1])
    assert TIME_LIMIT <= seconds < TIME_LIMIT + 3
    assert task_id not in unacked_task_ids(services)

    # and a restore sweep past the visibility timeout, while the tool still hangs, finds no
    # message of that step to deliver again
    time.sleep(max(0.0, started + visibility + 1 - time.monotonic()))
    assert marker.read_text() == "hanging", "the sweep came after the hang"
    restore_sweep(services, visibility)

    # and once the hung call returns, its late result is refused: nothing journaled twice
    wait_for(lambda: marker.read_text() == "woke up", timeout=HANG_SECONDS + 10,
             what="the hung call to return")  # fmt: skip
    ended = wait_for(
        lambda: re.search(r"abandoned work of an overrun step ended: .*'(\w+)'", worker.log()),
        timeout=10,
        what="the abandoned step to end",
    )
    assert ended.group(1) == StepOutcome.LEASE_LOST.value
    # and no step message was delivered twice, the hung step's included
    received = deliveries(worker.log())
    assert received[task_id] == 1, worker.log()[-3000:]
    assert set(received.values()) == {1}, received
    with transaction() as session:
        keys = session.scalars(select(JournalEntry.key).where(JournalEntry.run_id == run_id))
        journal = sorted(keys)
    assert [k for k in journal if k.startswith("model:")] == ["model:0", "model:1"]
    assert len([k for k in journal if k.startswith("tool:")]) == 1


@pytest.mark.timeout(120)
def test_a_step_past_its_time_limit_stops_at_its_next_tool_call_and_the_run_goes_on(
    db_url: str,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a 3 s step time limit and a reply asking for three tool calls of 1.5 s each: the
    # third starts past the limit however fast the claim was, and before the watchdog's extra
    # second unless the claim, the model and two journal writes took a second (a loaded machine)
    register_agents("tests.fixture_hangs:SLOW_THRICE")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    for name, value in {
        "NIGHTSHIFT_STEP_TIME_LIMIT": str(TIME_LIMIT),
        "NIGHTSHIFT_VISIBILITY_TIMEOUT": "60",
        "SLOW_SECONDS": "1.5",
    }.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    worker = processes("w1", pool="threads", concurrency=2)

    # when the run's first step passes its limit during its second call
    run_id = start_run("slow_thrice", {}).run_id
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}, 60)

    # then that step stopped before its third call (not stuck in one), and the next attempt
    # replayed the two journaled results and made only the third call
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert row.result["text"] == "Found 3 words."
    assert "passed its time limit of 3s (stopped at a call)" in worker.log()
    with transaction() as session:
        keys = list(session.scalars(select(JournalEntry.key).where(JournalEntry.run_id == run_id)))
    assert len([k for k in keys if k.startswith("tool:")]) == 3
    assert worker.log().count("slow_look_up replayed from the journal") == 2
