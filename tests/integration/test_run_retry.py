"""`nightshift runs retry RUN` and `POST /runs/{id}/retry`: a failed or cancelled run starts
again from its original request as a new run whose key names it; the two name each other; a
run is retried once, and a run that is not failed or cancelled is refused."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import update

from models import Run, RunStatus
from pipeline.db import transaction
from pipeline.errors import InvalidInput
from pipeline.runs.start import start_run
from pipeline.views.runs import show_run
from tests.integration.api_fixtures import AUTH, client
from tests.integration.conftest import ProcessFactory
from tests.support import nightshift, run_row, wait_for_status

DONE = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}
ECHO = "tests.fixture_agents:ECHO"
REPORT = {"agent": "nightly_report", "input": {"team": "ops", "date": "2026-11-29"}}


def test_a_run_failed_where_its_agent_was_missing_succeeds_when_retried(
    db_url: str, processes: ProcessFactory, register_agents: Callable[..., None]
) -> None:
    # given a run that failed on a worker without its agent (the key a caller gave it)
    register_agents(ECHO)
    stock = processes(
        "stock", env={"NIGHTSHIFT_AGENTS": "", "NIGHTSHIFT_UNKNOWN_AGENT_SECONDS": "2"}
    )
    origin = start_run("echo_outside", {"word": "again"}, "acme-ticket-7").run_id
    failed = wait_for_status(origin, DONE, timeout=60)
    assert (failed.status, failed.stop_reason) == (RunStatus.FAILED, "unknown_agent")
    # and the fleet now has a worker with the agent
    stock.stop()
    processes("knows")

    # when an operator retries it by its short id
    retried = nightshift("runs", "retry", str(origin)[:8], "--json")
    assert retried.returncode == 0, retried.stderr
    answer = json.loads(retried.stdout)
    retry = uuid.UUID(answer["run_id"])
    assert answer == {"run_id": str(retry), "created": True, "retry_of": str(origin)}

    # then the retry runs the same request to the end, under a key naming its origin
    row = wait_for_status(retry, DONE)
    assert row.status is RunStatus.SUCCEEDED, row.error
    assert (row.agent, row.input) == ("echo_outside", {"word": "again"})
    assert row.idempotency_key == f"retry-of:{origin}"
    # and each names the other, in the API's record and in `nightshift show`
    assert show_run(retry)["run"]["retry_of"] == str(origin)
    assert show_run(origin)["run"]["retried_as"] == [{"id": str(retry), "status": "succeeded"}]
    shown = nightshift("show", str(origin))
    assert f"retried as run {retry} (succeeded)" in shown.stdout, shown.stdout + shown.stderr
    # and asking again starts nothing new
    again = nightshift("runs", "retry", str(origin))
    assert again.returncode == 0, again.stderr
    assert f"already retried as run {retry}; nothing new started" in again.stdout
    # and a run that succeeded is refused, saying why
    refused = nightshift("runs", "retry", str(retry))
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"nightshift: run {retry} is succeeded: only a failed or cancelled run is retried"
    )


def test_the_api_retries_a_cancelled_run_once_with_its_time(db_url: str) -> None:
    # given a cancelled run that was given 15 minutes, and a running one
    api = client()
    started = api.post("/runs", json={**REPORT, "deadline": "15m"}, headers=AUTH).json()
    origin = started["run_id"]
    running = api.post("/runs", json=REPORT, headers=AUTH).json()["run_id"]
    with transaction() as session:
        session.execute(
            update(Run).where(Run.id == uuid.UUID(origin)).values(status=RunStatus.CANCELLED)
        )

    # when it is retried twice
    first = api.post(f"/runs/{origin}/retry", headers=AUTH)
    second = api.post(f"/runs/{origin}/retry", headers=AUTH)

    # then one run was started (201), and the second answer names it (200)
    assert first.status_code == 201, first.text
    retry = first.json()["run_id"]
    assert first.headers["Location"] == f"/runs/{retry}"
    assert (second.status_code, second.json()) == (200, {"run_id": retry, "created": False})
    # with the same request and as much time as the first was given
    row = run_row(uuid.UUID(retry))
    assert (row.agent, row.input, row.status) == (REPORT["agent"], REPORT["input"], "running")
    given = row.deadline - row.created_at
    assert given == timedelta(minutes=15)
    shown = api.get(f"/runs/{origin}", headers=AUTH).json()["run"]
    assert shown["retried_as"] == [{"id": retry, "status": "running"}]
    assert api.get(f"/runs/{retry}", headers=AUTH).json()["run"]["retry_of"] == origin
    # and a running run, or one that does not exist, is refused with a clear reason
    busy = api.post(f"/runs/{running}/retry", headers=AUTH)
    assert (busy.status_code, busy.json()) == (
        409,
        {"error": f"run {running} is running: only a failed or cancelled run is retried"},
    )
    assert api.post(f"/runs/{uuid.uuid4()}/retry", headers=AUTH).status_code == 404


def test_a_caller_cannot_take_a_retry_key(db_url: str) -> None:
    with pytest.raises(InvalidInput, match="keys starting 'retry-of:' are the retries' own"):
        start_run(REPORT["agent"], REPORT["input"], f"retry-of:{uuid.uuid4()}")
