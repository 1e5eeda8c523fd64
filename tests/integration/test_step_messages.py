"""A step message nightshift builds itself (pipeline/step_messages.py) is a standard Celery task
message: the same as Celery's own send_task writes, run by a normal worker, listed by `celery
inspect` and seen by `celery events`; and a night's first steps, pushed in chunks after the
fan-out's commit, lose nothing when the process dies between two chunks."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from models import Resumption, Run, RunStatus
from pipeline.app import app, send_step, step_kwargs
from pipeline.db import transaction
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from pipeline.step_messages import CHUNK, HANDED_OFF, STEP_TASK, step_kwargs_repr
from tests.integration.conftest import ProcessFactory
from tests.support import nightshift, wait_for, wait_for_status


def queued() -> list[dict[str, Any]]:
    """The messages waiting in this session's queue, oldest first, and empties it."""
    client = redis.Redis.from_url(get_settings().broker_url or "")
    try:
        raw = client.lrange(get_settings().queue, 0, -1)
        client.delete(get_settings().queue)
    finally:
        client.close()
    return [json.loads(message) for message in reversed(raw)]


def test_a_step_message_is_what_celery_itself_sends(db_url: str) -> None:
    # given the same step sent by nightshift and by Celery's own send_task (with the time limits
    # Celery copies into the message from a bound task's configuration: whether this process
    # has bound it yet depends on the tests that ran before in it)
    limits = {
        "time_limit": app.conf.task_time_limit,
        "soft_time_limit": app.conf.task_soft_time_limit,
    }
    run_id = uuid.uuid4()
    kwargs = step_kwargs(run_id, "bench", 3, "night-1")
    send_step(run_id, agent="bench", step=3, batch="night-1", handed_off=1764790000.25)
    app.send_task(
        STEP_TASK, kwargs=kwargs, kwargsrepr=step_kwargs_repr(kwargs), ignore_result=True,
        headers={HANDED_OFF: 1764790000.25}, **limits,
    )  # fmt: skip

    # then the two messages differ only in their ids
    ours, celerys = queued()
    ids = {"id", "root_id", "correlation_id", "delivery_tag"}
    for message in (ours, celerys):
        task_id = message["headers"]["id"]
        assert message["headers"]["root_id"] == message["properties"]["correlation_id"] == task_id
        for part in ("headers", "properties"):
            message[part] = {k: v for k, v in message[part].items() if k not in ids}
        message["body"] = json.loads(base64.b64decode(message["body"]))
    # send_task copies two of its options into the properties as well (no reader uses them)
    celerys["properties"] = {
        k: v for k, v in celerys["properties"].items() if k not in {"kwargsrepr", "reply_to"}
    }
    ours["properties"].pop("reply_to")
    assert ours == celerys


@pytest.fixture
def events() -> Iterator[list[dict[str, Any]]]:
    """Every task event on the broker while the test runs, as `celery events` receives them;
    this process sends `task-sent` events meanwhile, as NIGHTSHIFT_TASK_EVENTS=true has it."""
    sent_events = app.conf.task_send_sent_event
    app.conf.task_send_sent_event = True
    seen: list[dict[str, Any]] = []
    connection = app.connection_for_read()
    receiver = app.events.Receiver(connection, handlers={"*": seen.append})
    thread = threading.Thread(
        target=lambda: receiver.capture(limit=None, timeout=None, wakeup=False), daemon=True
    )
    thread.start()
    yield seen
    receiver.should_stop = True
    thread.join(timeout=5)
    connection.release()
    app.conf.task_send_sent_event = sent_events


def celery_cli(*argv: str) -> Any:
    """The real `celery` command against this test's app and broker; its --json answer."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "pipeline.app", *argv, "--json"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_normal_worker_runs_it_and_inspect_and_events_see_it(
    db_url: str,
    processes: ProcessFactory,
    events: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a worker sending task events, and this process sending task-sent events
    # (NIGHTSHIFT_TASK_EVENTS=true)
    monkeypatch.setenv("NIGHTSHIFT_TASK_EVENTS", "true")
    worker = processes("plain", concurrency=2)

    # when a run's first step is sent, and a step for a run that is not there is sent with a
    # delay (the worker holds it until its ETA)
    run_id = start_run("bench", {"steps": 2}).run_id
    send_step(uuid.uuid4(), agent="bench", countdown=300)

    # then the worker runs the run's steps
    wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=60)
    # and `celery inspect` lists the delayed one among the worker's scheduled tasks
    scheduled = celery_cli("inspect", "scheduled", "-d", worker.nodename)[worker.nodename]
    [held] = scheduled
    assert held["request"]["name"] == STEP_TASK and held["request"]["kwargs"]["agent"] == "bench"
    # and `celery events` saw each step of the run sent, received, started and succeeded
    wanted = {"task-sent", "task-received", "task-started", "task-succeeded"}

    def steps_seen() -> dict[str, set[str]] | None:
        mine = {e["uuid"] for e in events if str(run_id) in str(e.get("kwargs", ""))}
        by_task = {t: {e["type"] for e in events if e.get("uuid") == t} for t in mine}
        return by_task if len(by_task) == 2 and all(wanted <= s for s in by_task.values()) else None

    wait_for(steps_seen, timeout=20, what="the events of both steps")


def test_a_fan_out_that_dies_between_two_chunks_loses_no_child(
    db_url: str, processes: ProcessFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a schedule of a night of more children than one chunk sends
    children = CHUNK + 30
    schedules = tmp_path / "schedules.json"
    schedules.write_text(json.dumps([{
        "name": "big-night", "agent": "bench", "minute": "*",
        "params": {"children": children, "steps": 1},
    }]))  # fmt: skip
    monkeypatch.setenv("NIGHTSHIFT_SCHEDULES_FILE", str(schedules))

    # when the process that fires it dies after pushing the first chunk of first steps
    fired = nightshift(
        "schedules", "fire", "big-night", NIGHTSHIFT_CRASH_POINTS="between_publish_chunks"
    )
    assert fired.returncode == -9, fired.stderr
    with transaction() as session:
        runs = session.scalar(select(func.count()).select_from(Run))
    assert runs == children

    # and then beat's tick and a worker run
    processes("beat", beat=True)
    processes("worker", concurrency=8)

    # then every child runs, once: the tick sent the unsent ones once the chunk was taken
    def all_done() -> bool:
        with transaction() as session:
            query = select(func.count()).where(Run.status == RunStatus.SUCCEEDED)
            return session.scalar(query) == children + 1  # and the synthesis

    wait_for(all_done, timeout=180, what="every child and the synthesis to succeed")
    with transaction() as session:
        resent = session.scalars(select(Resumption.cause)).all()
        claims = session.scalar(select(func.sum(Run.fence)))
    assert resent == ["no_message"] * 30
    assert claims == children + 1, "each run was claimed once"
