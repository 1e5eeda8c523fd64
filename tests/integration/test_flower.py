"""What Flower sees, from the task events a real worker and beat send: every step task,
the first included, carries run_id, agent, step and batch as keyword arguments, and the
control tasks (the tick every second or two) send none, so they do not bury the steps."""

from __future__ import annotations

import ast
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from models import RunStatus
from pipeline.app import app
from pipeline.runs.start import start_run
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for_status

REPORT = {"team": "ops", "date": "2026-11-29"}


@pytest.fixture
def task_events() -> Iterator[list[dict[str, Any]]]:
    """Every task event on the broker while the test runs, as Flower receives them."""
    events: list[dict[str, Any]] = []
    ready = threading.Event()
    connection = app.connection_for_read()
    receiver = app.events.Receiver(connection, handlers={"*": events.append})

    def capture() -> None:
        for _ in receiver.consume(limit=None, timeout=None, wakeup=False):
            ready.set()

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    time.sleep(1.0)  # the receiver's queue is bound before the first event is sent
    yield events
    receiver.should_stop = True
    thread.join(timeout=5)
    connection.release()


@pytest.fixture
def tools(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    web = WebSandbox(log_path=tmp_path / "web.jsonl").start()
    email = EmailSandbox(log_path=tmp_path / "email.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_WEB_URL", web.url)
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_URL", email.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    # Task events always, task-sent included (by default workers send them only while Flower
    # runs: tests/integration/test_flower_events.py): the workers and beat read the setting,
    # this process's app (it sends the first step) was configured before the test.
    monkeypatch.setenv("NIGHTSHIFT_TASK_EVENTS", "true")
    monkeypatch.setitem(app.conf, "task_send_sent_event", True)
    get_settings.cache_clear()
    yield
    email.stop()
    web.stop()


def test_step_tasks_carry_keywords_and_control_tasks_stay_out_of_flower(
    tools: None, processes: ProcessFactory, task_events: list[dict[str, Any]]
) -> None:
    # given a worker and beat (ticking every second), and a nightly report run
    worker = processes("worker")
    beat = processes("beat", beat=True)
    run_id = start_run("nightly_report", REPORT).run_id
    done = wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=60)
    time.sleep(2.5)  # a few more ticks

    # then each of its steps was received with only keyword arguments, the first included
    ours = [e for e in task_events
            if e["type"] == "task-received" and str(run_id) in e.get("kwargs", "")]  # fmt: skip
    assert {e["name"] for e in ours} == {"pipeline.step"}
    assert all(ast.literal_eval(e["args"]) in ((), []) for e in ours)
    kwargs = [ast.literal_eval(e["kwargs"]) for e in ours]
    assert sorted(k["step"] for k in kwargs) == list(range(done.step))
    assert all(k["run_id"] == str(run_id) and k["agent"] == "nightly_report" for k in kwargs)
    assert all("batch" in k for k in kwargs)
    # and Flower's kwargs column reads agent, step and a short run id first
    short = str(run_id)[:8]
    first = "{{'agent': 'nightly_report', 'step': {step}, 'run': '{run}'"
    assert all(
        e["kwargs"].startswith(first.format(step=k["step"], run=short))
        for e, k in zip(ours, kwargs, strict=True)
    )

    # and the tick ran on this worker, but sent no event Flower would list
    assert "Sending due task tick" in beat.log() or "pipeline.tick" in beat.log()
    assert "pipeline.tick" in worker.log()
    from_here = [e for e in task_events if e.get("hostname") == worker.nodename]
    assert from_here and not [e for e in from_here if e.get("name") == "pipeline.tick"]
    control = get_settings().control_queue
    sent = [e for e in task_events if e["type"] == "task-sent" and e.get("queue") == control]
    assert sent == []
    steps_sent = [e for e in task_events if e["type"] == "task-sent" and str(run_id) in e["kwargs"]]
    assert len(steps_sent) == done.step
