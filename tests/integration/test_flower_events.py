"""Flower still sees steps although workers send no task events by default: what Flower does
on start (the enable_events control command, repeated while it runs) turns them on."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for_status


class Events:
    """Task events one worker published, captured from the broker as Flower captures them."""

    def __init__(self, hostname: str) -> None:
        from pipeline.app import app

        self.hostname = hostname
        self.seen: list[dict[str, Any]] = []
        self._connection = app.connection_for_read()
        self._receiver = app.events.Receiver(self._connection, handlers={"*": self._on_event})
        self._thread = threading.Thread(target=self._capture, daemon=True)

    def _on_event(self, event: dict[str, Any]) -> None:
        if event.get("hostname") == self.hostname and event["type"].startswith("task-"):
            self.seen.append(event)

    def _capture(self) -> None:
        self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def start(self) -> Events:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._receiver.should_stop = True
        self._thread.join(timeout=5)
        self._connection.release()

    def of_steps(self) -> dict[str, set[str]]:
        """Event types by task id, for the pipeline.step tasks received."""
        steps = {e["uuid"] for e in self.seen if e.get("name") == "pipeline.step"}
        by_task: dict[str, set[str]] = {task: set() for task in steps}
        for event in self.seen:
            if event.get("uuid") in by_task:
                by_task[event["uuid"]].add(event["type"])
        return by_task


@pytest.fixture
def worker_events(
    db_url: str, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Events]]:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("NIGHTSHIFT_TASK_EVENTS", raising=False)
    get_settings.cache_clear()
    worker = processes("events", concurrency=1)
    events = Events(worker.nodename).start()
    yield worker.nodename, events
    events.stop()


def finish_run(steps: int) -> uuid.UUID:
    run_id = start_run("bench", {"steps": steps}).run_id
    wait_for_status(run_id, {"succeeded"}, timeout=60)
    return run_id


def test_steps_send_no_task_events_until_flower_enables_them(
    worker_events: tuple[str, Events],
) -> None:
    from pipeline.app import app

    nodename, events = worker_events
    # Given a worker with the default settings: a run goes through and no task event is sent.
    finish_run(steps=2)
    assert events.of_steps() == {}

    # When Flower starts, it broadcasts enable_events to the workers.
    replies = app.control.broadcast("enable_events", destination=[nodename], reply=True, timeout=5)
    assert replies, "the worker did not answer the enable_events command"

    # Then every step of the next run is seen received, started and succeeded.
    finish_run(steps=3)
    by_task = wait_for_events(events, tasks=3)
    assert all(
        {"task-received", "task-started", "task-succeeded"} <= types for types in by_task.values()
    ), by_task


def wait_for_events(events: Events, tasks: int) -> dict[str, set[str]]:
    from pipeline.processes.celery_process import wait_for

    def complete() -> dict[str, set[str]] | None:
        by_task = events.of_steps()
        done = [t for t, types in by_task.items() if "task-succeeded" in types]
        return by_task if len(done) >= tasks else None

    return wait_for(complete, timeout=10, what=f"task events of {tasks} steps")


def test_nightshift_flower_shows_the_step_kwargs_second(tmp_path: Path) -> None:
    # given nightshift flower with its own columns
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log_path = tmp_path / "flower.log"
    with log_path.open("w") as log:
        flower = subprocess.Popen(
            [str(Path(sys.executable).with_name("nightshift")), "flower", "--no-auth",
             f"--port={port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            # when a person opens its task list, then a step reads "agent, step, run" second
            page = _get_when_up(f"http://127.0.0.1:{port}/tasks", log_path)
        finally:
            flower.terminate()
            flower.wait(timeout=10)
    headers = [cell.split("</th>")[0].split(">")[-1].strip() for cell in page.split("<th")[1:]]
    assert [h for h in headers if h][:3] == ["Name", "kwargs", "State"], headers


def _get_when_up(url: str, log_path: Path) -> str:
    deadline = time.monotonic() + 30
    while True:
        try:
            return httpx.get(url, timeout=5).text
        except httpx.HTTPError:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)
