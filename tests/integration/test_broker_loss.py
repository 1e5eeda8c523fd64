"""The broker loses everything it held (FLUSHALL; a Redis failover to an empty replica; a
restart without persistence): every run still completes. The tick re-sends the runs whose
step message was lost, and messages published after the loss still reach the workers.

The broker is the test's own embedded Redis (it is flushed); PostgreSQL is the session's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from models import RunStatus
from pipeline import embedded
from pipeline.processes.celery_process import CeleryProcess, wait_for
from tests.support import run_row

NIGHTSHIFT = str(Path(sys.executable).parent / "nightshift")
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}


@pytest.fixture
def own_redis() -> Iterator[Path]:
    data_dir = Path(tempfile.mkdtemp(prefix="nightshift-broker-loss-", dir="/tmp"))
    yield data_dir
    embedded.stop(data_dir)
    shutil.rmtree(data_dir, ignore_errors=True)


def start(env: dict[str, str], steps: int) -> uuid.UUID:
    argv = [NIGHTSHIFT, "start", "bench", "--input", json.dumps({"steps": steps}), "--json"]
    done = subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=True
    )
    return uuid.UUID(json.loads(done.stdout)["run_id"])


def lose_everything(client: redis.Redis, own_redis: Path, url: str, how: str) -> None:
    if how == "flushall":
        client.flushall()
        return
    # a fresh, empty Redis on the same port: a failover to an empty replica, or no persistence
    embedded.stop(own_redis)
    redis_dir = own_redis / "redis"
    for data in (*redis_dir.glob("*.aof*"), *redis_dir.glob("*.rdb")):
        data.unlink()
    shutil.rmtree(redis_dir / "appendonlydir", ignore_errors=True)
    assert embedded.ensure_running(own_redis, postgres=False)["redis"] == url


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["flushall", "fresh"])
def test_a_run_whose_step_message_the_broker_lost_completes(
    how: str, db_url: str, own_redis: Path, tmp_path: Path
) -> None:
    url = embedded.ensure_running(own_redis, postgres=False)["redis"]
    env = {
        "NIGHTSHIFT_DATABASE_URL": db_url,
        "NIGHTSHIFT_BROKER_URL": url,
        "NIGHTSHIFT_HANDOFF_GRACE_SECONDS": "3",
    }
    queue = os.environ["NIGHTSHIFT_QUEUE"]
    first = CeleryProcess("w1", tmp_path / "w1.log", env, concurrency=4).start()
    beat = CeleryProcess("beat", tmp_path / "beat.log", env, beat=True).start()
    client = redis.Redis.from_url(url)
    second = CeleryProcess("w2", tmp_path / "w2.log", env, concurrency=4)
    try:
        # given a run whose next step message waits in the broker, no worker consuming it
        run_id = start(env, steps=200)
        wait_for(lambda: run_row(run_id).step >= 3, timeout=60, what="the run to get going")
        first.stop()  # a warm shutdown: the step in hand checkpoints and sends the next one
        wait_for(lambda: client.llen(queue), timeout=30, what="the next step's message")
        step_at_loss = run_row(run_id).step

        # when the broker loses everything: that message, the unacked ones, results
        lose_everything(client, own_redis, url, how)
        assert not client.llen(queue), "the step message survived"

        # then a worker that comes up finishes the run (the tick re-sent the step)
        second.start()
        row = wait_for(lambda: run_row(run_id).status in DONE and run_row(run_id), timeout=150,
                       what="the run to finish")  # fmt: skip
        assert row.status == RunStatus.SUCCEEDED, row.error
        assert row.step > step_at_loss
        assert not beat.exited() and not second.exited()
    finally:
        client.close()
        for process in (beat, second, first):
            process.stop()
