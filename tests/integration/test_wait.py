"""Waiting for a run's outcome with no worker held: the API's long-poll (`?wait=`), the
command line's `start --wait` and the client helper for other services."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select, text, update

from models import Run, RunStatus
from pipeline.api.client import NightshiftClient, wait_for_run
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.runs.start import start_run
from tests.integration.api_fixtures import AUTH, TOKEN, client, live_server, make_app
from tests.integration.conftest import ProcessFactory, Sandbox, Services
from tests.support import wait_for

REPORT = {"team": "ops", "date": "2026-11-29"}
BUG = {"issue": 61, "repo": "acme/shop", "title": "totals are not rounded"}


def set_status(run_id: uuid.UUID, status: RunStatus, **values: Any) -> None:
    with transaction() as session:
        session.execute(update(Run).where(Run.id == run_id).values(status=status, **values))


def listeners() -> int:
    with transaction() as session:
        return int(
            session.scalar(
                select(func.count())
                .select_from(text("pg_stat_activity"))
                .where(
                    text("datname = current_database() AND query = 'LISTEN nightshift_run_settled'")
                )
            )
            or 0
        )


def test_a_long_poll_answers_within_a_second_of_the_run_finishing(db_url: str) -> None:
    # given a run that is running, and a client waiting up to 30 seconds for it
    run_id = start_run("nightly_report", REPORT).run_id
    answer: dict[str, Any] = {}

    def wait(base: str) -> None:
        response = httpx.get(f"{base}/runs/{run_id}?wait=30", headers=AUTH, timeout=40)
        answer["at"] = time.monotonic()
        answer["response"] = response

    with live_server(make_app()) as base:
        waiter = threading.Thread(target=wait, args=(base,))
        asked = time.monotonic()
        waiter.start()
        time.sleep(1.5)
        assert waiter.is_alive(), "it waits while the run runs"
        wait_for(lambda: listeners() == 1, timeout=10, what="the waiter to listen")
        # when the run finishes
        set_status(run_id, RunStatus.SUCCEEDED, stop_reason="completed", result={"text": "ok"})
        finished = time.monotonic()
        waiter.join(timeout=10)
    # then the answer came within a second, with the finished run
    assert answer["at"] - finished < 1.0, answer["at"] - finished
    assert answer["at"] - asked > 1.5
    run = answer["response"].json()["run"]
    assert (run["status"], run["result"]) == ("succeeded", {"text": "ok"})
    print(f"\nlong-poll answered {1000 * (answer['at'] - finished):.0f} ms after the commit")


def test_a_long_poll_answers_at_once_for_a_settled_run_and_at_the_timeout_otherwise(
    db_url: str,
) -> None:
    api = client()
    waiting = start_run("nightly_report", REPORT).run_id
    set_status(waiting, RunStatus.WAITING, waiting_on="approval:pr:1")
    began = time.monotonic()
    answer = api.get(f"/runs/{waiting}?wait=30", headers=AUTH).json()
    shown = answer["run"]
    assert shown["status"] == "waiting" and time.monotonic() - began < 2
    # with the outcome POST /runs?wait= gives
    assert answer["outcome"]["status"] == "waiting"
    assert answer["outcome"]["waiting_on"] == "approval:pr:1"
    running = start_run("nightly_report", {**REPORT, "team": "pricing"}).run_id
    began = time.monotonic()
    still = api.get(f"/runs/{running}?wait=1", headers=AUTH)
    assert 1 <= time.monotonic() - began < 4
    assert still.status_code == 200 and still.json()["run"]["status"] == "running"
    assert still.json()["outcome"]["status"] == "running"
    assert "outcome" not in api.get(f"/runs/{running}", headers=AUTH).json()
    # bad waits and unknown runs are refused before any waiting
    for bad in ("-1", "121", "soon"):
        refused = api.get(f"/runs/{running}?wait={bad}", headers=AUTH)
        assert refused.status_code == 422 and "'wait'" in refused.json()["error"]
    missing = api.get(f"/runs/{uuid.uuid4()}?wait=5", headers=AUTH)
    assert missing.status_code == 404 and "no run has id" in missing.json()["error"]
    # and the last waiter closed the listener (its backend goes a moment later)
    wait_for(lambda: listeners() == 0, timeout=5, what="the listener to close")


def test_many_waiters_share_one_listen_connection(db_url: str) -> None:
    runs = [start_run("nightly_report", {**REPORT, "team": f"t{n}"}).run_id for n in range(20)]
    answers: list[int] = []

    def wait(base: str, run_id: uuid.UUID) -> None:
        response = httpx.get(f"{base}/runs/{run_id}?wait=30", headers=AUTH, timeout=40)
        answers.append(response.status_code)

    with live_server(make_app()) as base:
        waiters = [threading.Thread(target=wait, args=(base, r)) for r in runs]
        for waiter in waiters:
            waiter.start()
        wait_for(lambda: listeners() == 1, timeout=10, what="one listener for all waiters")
        time.sleep(0.5)
        assert listeners() == 1
        for run_id in runs:
            set_status(run_id, RunStatus.FAILED, stop_reason="deadline")
        for waiter in waiters:
            waiter.join(timeout=10)
        assert answers == [200] * 20
        wait_for(lambda: listeners() == 0, timeout=5, what="the listener to close")


def test_starting_with_wait_answers_with_the_outcome(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    processes("w1")
    api = client()
    response = api.post("/runs?wait=60", json={"agent": "nightly_report", "input": REPORT},
                        headers=AUTH)  # fmt: skip
    assert response.status_code == 201, response.text
    started = response.json()
    outcome = started["outcome"]
    assert (outcome["status"], outcome["stop_reason"]) == ("succeeded", "completed")
    assert outcome["run_id"] == started["run_id"] and "report" in outcome["result"]["text"]
    # without wait, there is no outcome in the answer
    again = api.post("/runs", json={"agent": "nightly_report", "input": REPORT}, headers=AUTH)
    assert "outcome" not in again.json()


# -- the command line and the client helper: real workers and beat -------------------------


def test_start_wait_prints_the_outcome_and_exits_with_its_code(
    services_up: Services,
    processes: ProcessFactory,
    capsys: pytest.CaptureFixture[str],
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register_agents("tests.fixture_agents:APPROVAL_ONLY")
    monkeypatch.setenv("NIGHTSHIFT_APPROVERS_OPEN_PULL", "lead@example.com")
    processes("w1")
    processes("beat", beat=True)
    # a run that checks back in 2 seconds: waited through its timer, to its result
    assert main(["start", "follow_up", "--input", '{"after_seconds": 2}', "--wait"]) == 0
    out = capsys.readouterr().out
    assert "succeeded (completed)" in out and "Checked the deploys" in out
    # one whose deadline passes while it waits: non-zero, with the reason
    code = main(["start", "follow_up", "--input", '{"after_seconds": 60}', "--deadline", "2",
                 "--wait", "--timeout", "30"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1 and "failed (deadline)" in out and "deadline passed" in out
    # one that waits for an approval: that is the outcome, with what to do, as whom
    bug = '{"issue": 61, "repo": "acme/shop", "title": "totals are not rounded"}'
    assert main(["start", "approval_only", "--input", bug, "--wait", "--timeout", "30"]) == 3
    key = "approval_only:acme/shop:patch/issue-61"
    said = f"{key} by lead@example.com: nightshift approve {key} --as lead@example.com"
    assert said in capsys.readouterr().out
    # and one that outlasts --timeout, as JSON
    code = main(["start", "follow_up", "--input", '{"after_seconds": 60}', "--wait",
                 "--timeout", "2", "--json"])  # fmt: skip
    assert code == 4
    assert '"status": "waiting"' in capsys.readouterr().out
    assert main(["start", "follow_up", "--input", '{"after_seconds": 1}', "--timeout", "5"]) == 2
    assert "--timeout needs --wait" in capsys.readouterr().err


def test_other_services_wait_for_a_run_through_the_client_helper(
    services_up: Services,
    processes: ProcessFactory,
    monkeypatch: pytest.MonkeyPatch,
    register_agents: Callable[..., None],
) -> None:
    register_agents("tests.fixture_agents:APPROVAL_ONLY")
    processes("w1")
    processes("beat", beat=True)
    with live_server(make_app()) as base:
        monkeypatch.setenv("NIGHTSHIFT_API_URL", base)
        monkeypatch.setenv("NIGHTSHIFT_API_TOKEN", TOKEN)
        with NightshiftClient() as api:
            # a run that waits on a timer is waited through, to its result
            run_id = api.start_run("follow_up", {"after_seconds": 2}, idempotency_key="f-1")
            done = wait_for_run(run_id, timeout=60)
            assert done.succeeded and "Checked the deploys" in (done.result or {})["text"]
            # one waiting for a person comes back as it is, for the caller to decide
            patch = api.start_run("approval_only", BUG, deadline="10m")
            parked = api.wait_for_run(patch, timeout=60)
            assert (parked.status, parked.needs_person) == ("waiting", True)
            assert parked.waiting_on == "approval:approval_only:acme/shop:patch/issue-61"
            # and one still going when the time is up is returned as it is
            slow = api.start_run("follow_up", {"after_seconds": 60})
            began = time.monotonic()
            late = api.wait_for_run(slow, timeout=2)
            assert not late.finished and 2 <= time.monotonic() - began < 6
