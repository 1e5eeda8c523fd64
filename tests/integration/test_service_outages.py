"""PostgreSQL or Redis goes away under running workers, beat and a client, and comes back: the
worker and beat say so in two lines (not a traceback a tick), the client in one that says the
run carries on and how to recover, and every run finishes. A second Ctrl-C to a worker exits
at once without a traceback.

PostgreSQL is the session's, reached through a proxy the test cuts (tests/cut_proxy.py): for a
process behind it, the server stopped. Redis is the test's own embedded one, stopped and
started again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from models import RunStatus
from pipeline import embedded
from pipeline.celery_patches import COLD_SHUTDOWN_EXIT
from pipeline.processes.celery_process import CeleryProcess, wait_for
from tests.cut_proxy import CutProxy
from tests.integration.conftest import ProcessFactory
from tests.support import run_row

NIGHTSHIFT = str(Path(sys.executable).parent / "nightshift")
OUTAGE_SECONDS = 10.0
"""Longer than the lease (4 s in tests) and ten ticks (1 s): leases lapse, ticks fail."""


def start(
    env: dict[str, str], steps: int, *more: str, model_seconds: float = 0.5
) -> subprocess.Popen[str]:
    argv = [NIGHTSHIFT, "start", "bench", "--input",
            json.dumps({"steps": steps, "model_seconds": model_seconds}), *more]  # fmt: skip
    return subprocess.Popen(
        argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def started_run(client: subprocess.Popen[str]) -> uuid.UUID:
    assert client.stdout is not None
    first = client.stdout.readline()  # "started run <id>"
    assert first.startswith("started run "), first
    return uuid.UUID(first.split()[-1])


def all_succeed(runs: list[uuid.UUID]) -> None:
    for run_id in runs:
        row = wait_for(lambda r=run_id: run_row(r).status in {"succeeded", "failed"}
                       and run_row(r), timeout=120, what=f"run {run_id} to finish")  # fmt: skip
        assert row.status == RunStatus.SUCCEEDED, row.error


@pytest.mark.timeout(240)
def test_a_database_outage_is_two_lines_in_the_worker_one_in_the_client_and_runs_finish(
    db_url: str, tmp_path: Path
) -> None:
    proxy, through = CutProxy.before(db_url)
    env = {"NIGHTSHIFT_DATABASE_URL": through}
    worker = CeleryProcess("w1", tmp_path / "w1.log", env, concurrency=4).start()
    beat = CeleryProcess("beat", tmp_path / "beat.log", env, beat=True).start()
    try:
        # given three runs moving and a client waiting for one of them
        clients = [start(env, 30, "--wait") for _ in range(3)]
        runs = [started_run(client) for client in clients]
        wait_for(lambda: all(run_row(r).step >= 2 for r in runs), timeout=60, what="the runs")

        # when PostgreSQL goes away for longer than a lease and many ticks, then comes back
        proxy.cut()
        waited = clients[0].communicate(timeout=60)
        time.sleep(OUTAGE_SECONDS)
        proxy.mend()

        # then the clients each said in one line that the run carries on and what to do
        out, err = waited
        assert clients[0].returncode == 2, (out, err)
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"run {runs[0]} carries on" in err and f"nightshift watch {runs[0]}" in err, err
        assert "cannot reach the database at" in err and "NIGHTSHIFT_DATABASE_URL" in err, err
        # and every run finishes once the database is back
        all_succeed(runs)
        # and the worker said it in a line when it went away and one when it was back
        log = worker.log()
        assert 1 <= log.count("database unreachable since") <= 2, log[-5000:]
        assert 1 <= log.count("database reachable again after") <= 2, log[-5000:]
        assert "Traceback" not in log and "OperationalError" not in log, log[-5000:]
        assert "Traceback" not in beat.log()
    finally:
        proxy.cut()
        for client in clients:
            client.kill()
            client.communicate()
        worker.stop()
        beat.stop()


@pytest.mark.timeout(240)
def test_a_broker_outage_is_two_lines_in_beat_no_traceback_in_the_worker_and_runs_finish(
    db_url: str, tmp_path: Path
) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="nightshift-outage-", dir="/tmp"))
    url = embedded.ensure_running(data_dir, postgres=False)["redis"]
    env = {"NIGHTSHIFT_BROKER_URL": url}
    worker = CeleryProcess("w1", tmp_path / "w1.log", env, concurrency=4)
    beat = CeleryProcess("beat", tmp_path / "beat.log", env, beat=True)
    try:
        worker.start(), beat.start()
        # given two runs moving
        clients = [start(env, 30) for _ in range(2)]
        runs = [started_run(client) for client in clients]
        for client in clients:
            client.communicate()
        wait_for(lambda: all(run_row(r).step >= 2 for r in runs), timeout=60, what="the runs")

        # when Redis stops for many ticks, then starts again on the same address
        embedded.stop(data_dir)
        time.sleep(OUTAGE_SECONDS)
        assert embedded.ensure_running(data_dir, postgres=False)["redis"] == url

        # then every run finishes
        all_succeed(runs)
        # and beat said it in a line when Redis went away and one when it was back
        beat_log = beat.log()
        assert 1 <= beat_log.count("broker unreachable since") <= 2, beat_log[-5000:]
        assert 1 <= beat_log.count("broker reachable again after") <= 2, beat_log[-5000:]
        assert "Traceback" not in beat_log, beat_log[-5000:]
        # and the worker logged no traceback and nothing CRITICAL (Celery's consumer still says
        # each reconnection attempt, in a line)
        log = worker.log()
        assert "Traceback" not in log and "CRITICAL" not in log, log[-5000:]
    finally:
        worker.stop()
        beat.stop()
        embedded.stop(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.timeout(120)
def test_a_second_ctrl_c_exits_the_worker_at_once_without_a_traceback(
    db_url: str, processes: ProcessFactory
) -> None:
    # given a threads worker in the middle of two steps that take 30 s each
    worker = processes("w1", concurrency=2)
    clients = [start({}, 2, model_seconds=30) for _ in range(2)]
    runs = [started_run(client) for client in clients]
    for client in clients:
        client.communicate()
    wait_for(lambda: all(run_row(r).lease_owner for r in runs), timeout=30, what="claims")
    held_by = {run_row(r).lease_owner for r in runs}

    # when Ctrl-C is pressed twice: a warm shutdown, then a cold one
    worker.signal(signal.SIGINT)
    time.sleep(1.0)
    asked = time.monotonic()
    worker.signal(signal.SIGINT)
    assert worker.process is not None
    code = worker.process.wait(timeout=20)

    # then it exits at once (not after its steps), saying in one line what becomes of them,
    # with no traceback and no CRITICAL line
    assert time.monotonic() - asked < 10, "the worker waited for its steps"
    assert code == COLD_SHUTDOWN_EXIT
    log = worker.log()
    assert "Traceback" not in log and "CRITICAL" not in log and "kill_job" not in log, log
    assert log.count("cold shutdown: the steps in flight are resumed by another worker") == 1
    # and its runs are not lost: once their leases lapse, another worker takes them over
    processes("w2", concurrency=2)
    processes("beat", beat=True)
    for run_id in runs:
        wait_for(lambda r=run_id: run_row(r).lease_owner not in held_by | {None}, timeout=60,
                 what=f"run {run_id} to be resumed by w2")  # fmt: skip
