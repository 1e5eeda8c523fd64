"""A worker that cannot reach PostgreSQL is not ready: `nightshift ready` says so (exit 1, one
line) and the worker takes no tick until PostgreSQL answers again, while a worker that reaches
it stays ready and takes them. PostgreSQL is the session's, reached by the first worker through
a proxy the test cuts (tests/cut_proxy.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.processes.celery_process import CeleryProcess, wait_for
from tests.cut_proxy import CutProxy

NIGHTSHIFT = str(Path(sys.executable).parent / "nightshift")
TICK = re.compile(r"Task pipeline\.tick\[[0-9a-f-]+\] received")


def ready(path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NIGHTSHIFT_WORKER_HEARTBEAT_SECONDS": "1"}
    return subprocess.run(
        [NIGHTSHIFT, "ready", "--file", str(path)], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def ticks(worker: CeleryProcess) -> int:
    return len(TICK.findall(worker.log()))


@pytest.mark.timeout(240)
def test_a_worker_without_postgres_is_not_ready_and_takes_no_tick(
    db_url: str, tmp_path: Path
) -> None:
    proxy, through = CutProxy.before(db_url)
    beats = {"NIGHTSHIFT_WORKER_HEARTBEAT_SECONDS": "1"}
    files = {name: tmp_path / f"{name}.ready" for name in ("cut", "whole")}
    cut = CeleryProcess("cut", tmp_path / "cut.log", {
        **beats, "NIGHTSHIFT_DATABASE_URL": through,
        "NIGHTSHIFT_WORKER_READY_FILE": str(files["cut"]),
    }, concurrency=2)  # fmt: skip
    whole = CeleryProcess("whole", tmp_path / "whole.log", {
        **beats, "NIGHTSHIFT_WORKER_READY_FILE": str(files["whole"]),
    }, concurrency=2)  # fmt: skip
    beat = CeleryProcess("beat", tmp_path / "beat.log", beat=True)
    processes = [cut.start(wait=False), whole.start(wait=False), beat.start(wait=False)]
    try:
        # given two ready workers taking ticks (one a second, from beat)
        wait_for(lambda: all(p.ready() for p in processes), timeout=120, what="the processes")
        wait_for(lambda: ready(files["cut"]).returncode == 0, timeout=30, what="cut ready")
        wait_for(lambda: ticks(cut) and ticks(whole), timeout=60, what="both to take ticks")

        # when PostgreSQL goes away for one of them
        proxy.cut()

        # then it says it is not ready, in one line, and takes no tick while the other does
        def not_ready() -> str | None:
            answer = ready(files["cut"])
            return answer.stderr if answer.returncode == 1 else None

        said = wait_for(not_ready, timeout=30, what="cut to be not ready")
        assert said.count("\n") == 1 and "not ready" in said, said
        wait_for(lambda: "taking no ticks" in cut.log(), timeout=30, what="cut to stop ticks")
        cut_before, whole_before = ticks(cut), ticks(whole)
        wait_for(lambda: ticks(whole) >= whole_before + 5, timeout=60, what="five more ticks")
        assert ticks(cut) == cut_before, cut.log()[-3000:]
        assert ready(files["whole"]).returncode == 0
        assert not cut.exited(), cut.log()[-3000:]

        # and once PostgreSQL answers again it is ready and takes ticks again
        proxy.mend()
        wait_for(lambda: ready(files["cut"]).returncode == 0, timeout=30, what="cut ready again")
        wait_for(lambda: ticks(cut) > cut_before, timeout=60, what="cut to take a tick again")
        assert "Traceback" not in cut.log(), cut.log()[-3000:]
    finally:
        proxy.cut()
        for process in processes:
            process.stop()

    # and a worker that stopped is not ready
    assert ready(files["whole"]).returncode == 1
