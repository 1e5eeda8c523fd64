"""Issue 26's reproductions that need real workers: what a tool's own HTTP call leaves in the
worker's log, and whose name a cancellation through the broker carries."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from models import RunStatus
from pipeline import tasks
from pipeline.runs.start import start_run
from pipeline.sandbox.web import WebSandbox
from tests.integration.api_fixtures import park_on_approval
from tests.integration.conftest import ProcessFactory
from tests.support import run_row, wait_for_status

DONE = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}


def test_a_tools_http_call_logs_no_password_and_no_query_string(
    db_url: str, processes: ProcessFactory, register_agents: Callable[..., None], tmp_path: Path
) -> None:
    # given a worker running an agent whose tool calls a URL with user:password@ and a query
    register_agents("tests.fixture_agents:PAGE_FETCHER")
    web = WebSandbox(log_path=tmp_path / "web.jsonl").start()
    try:
        worker = processes("w1")
        host = web.url.removeprefix("http://")
        url = f"http://ops:pw-5e1d@{host}/sources/ops?token=q-5e1d"
        # when a run of it makes the call
        row = wait_for_status(start_run("page_fetcher", {"url": url}).run_id, DONE)
    finally:
        web.stop()
    assert row.status is RunStatus.SUCCEEDED, row.error

    # then httpx's own line names the request, without the password or the query string
    log = worker.log()
    assert "HTTP Request: GET http://ops:***@" in log and "/sources/ops?***" in log
    assert "pw-5e1d" not in log and "q-5e1d" not in log


def test_a_cancellation_through_the_broker_is_recorded_as_the_broker_clients(
    db_url: str, processes: ProcessFactory
) -> None:
    # given a run waiting for an approval, and a worker
    run_id = park_on_approval()
    processes("w1")
    # when a client with the broker's password cancels it in the CEO's name
    sent = tasks.cancel_run.delay(str(run_id), "ceo@example.com")
    # then the run is cancelled, in no one's name but the broker client's
    assert sent.get(timeout=30) == RunStatus.CANCELLED.value
    row = run_row(run_id)
    assert (row.status, row.cancel_requested_by) == (RunStatus.CANCELLED, "broker client")
