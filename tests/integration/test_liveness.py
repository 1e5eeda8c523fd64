"""Say when nothing will move: `nightshift runs`/`show` and the status page tell that no worker
consumes the run's queue (heartbeats in the database), and that a runnable run has gone
unclaimed for longer than the tick allows."""

from __future__ import annotations

import os
from datetime import timedelta
from html import unescape

import pytest
from sqlalchemy import func, select, update

from models import Run, WorkerHeartbeat
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.processes.celery_process import wait_for
from pipeline.runs.start import start_run
from pipeline.runs.workers import heartbeat
from tests.integration.api_fixtures import client
from tests.integration.conftest import ProcessFactory
from tests.integration.test_status_page import sign_in

REPORT = {"team": "ops", "date": "2026-11-29"}


def heartbeats() -> list[WorkerHeartbeat]:
    with transaction() as session:
        return list(session.scalars(select(WorkerHeartbeat)))


def test_with_no_worker_runs_show_and_the_page_say_nothing_will_move(
    db_url: str, capsys: pytest.CaptureFixture[str], processes: ProcessFactory
) -> None:
    # given a run and no worker, ever
    queue = os.environ["NIGHTSHIFT_QUEUE"]
    run_id = start_run("nightly_report", REPORT).run_id
    nobody = f"no worker has been seen for queue {queue!r} (none ever)"
    assert main(["runs"]) == 0
    assert f"note: {nobody}: nothing moves its runs" in capsys.readouterr().out
    assert main(["show", str(run_id)[:8]]) == 0
    assert f"note: {nobody}" in capsys.readouterr().out
    page = client()
    sign_in(page)
    assert nobody in unescape(page.get("/ui").text)
    assert nobody in unescape(page.get(f"/ui/runs/{run_id}").text)

    # when a worker runs, it records its heartbeat with the queues it consumes, and the note goes
    worker = processes("worker")
    [beat] = wait_for(heartbeats, timeout=20, what="a worker heartbeat")
    assert beat.name == worker.nodename and queue in beat.queues and beat.stopped_at is None
    assert main(["runs"]) == 0
    assert "note:" not in capsys.readouterr().out
    assert 'id="no-worker"' not in page.get("/ui").text

    # and once it stopped, the note says when one was last seen
    worker.stop()
    assert heartbeats()[0].stopped_at is not None
    start_run("nightly_report", {**REPORT, "team": "dev"})
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert f"no worker has been seen for queue {queue!r} (the last one " in out
    assert "1 running run(s) listed here wait for it" in out


def test_a_runnable_run_nobody_claims_for_longer_than_the_tick_allows_is_named(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a live worker for the queue, and a run runnable for ten minutes with no claim
    heartbeat("worker@elsewhere", [os.environ["NIGHTSHIFT_QUEUE"]])
    run_id = start_run("nightly_report", REPORT).run_id
    with transaction() as session:
        ago = func.now() - timedelta(minutes=10)
        session.execute(update(Run).where(Run.id == run_id).values(updated_at=ago))

    # then runs and show name it, and say what to check
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert f"run {str(run_id)[:8]} is runnable for 10 min and no worker has claimed it" in out
    assert "check that beat runs (nightshift beat)" in out
    assert main(["show", str(run_id)]) == 0
    assert "note: this run is runnable for 10 min" in capsys.readouterr().out
    page = client()
    sign_in(page)
    assert "This run is runnable for 10 min" in page.get(f"/ui/runs/{run_id}").text
