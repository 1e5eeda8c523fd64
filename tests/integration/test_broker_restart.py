"""A worker survives its Redis restarting while it holds an unacknowledged step message.

Before pipeline.celery_patches.install_broker_guard every such worker exited with
`Unrecoverable error: AttributeError("'NoneType' object has no attribute 'hostname'")`. The
crash needs a step running (its message unacked, acks_late) and a free slot (a BRPOP in flight
on the task channel) when the connection breaks; the test waits for both, seen in Redis, then
kills it.

The worker's Redis is embedded and the test's own (it is killed); PostgreSQL is the session's.
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
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from models import RunStatus
from pipeline import embedded
from pipeline.processes.celery_process import CeleryProcess, wait_for
from pipeline.sandbox.messages_api import MessagesSandbox
from pipeline.sandbox.responders import agent_responder
from tests.support import run_row

NIGHTSHIFT = str(Path(sys.executable).parent / "nightshift")
SLOW_MODEL = 8.0
"""The first model call takes this long: Redis dies and comes back inside it."""


@pytest.fixture
def own_redis() -> Iterator[Path]:
    data_dir = Path(tempfile.mkdtemp(prefix="nightshift-broker-restart-", dir="/tmp"))
    yield data_dir
    embedded.stop(data_dir)
    shutil.rmtree(data_dir, ignore_errors=True)


def kill_and_restart(data_dir: Path, url: str) -> None:
    """SIGKILL the embedded Redis (a crash), then start it again on the same port."""
    (info,) = [i for i in embedded.status(data_dir) if i.name == "redis"]
    assert info.pid is not None
    os.kill(info.pid, signal.SIGKILL)
    wait_for(lambda: not embedded.status(data_dir)[1].running, timeout=10, what="redis to die")
    time.sleep(1.0)
    assert embedded.ensure_running(data_dir, postgres=False)["redis"] == url


def holds_unacked_and_polls(client: redis.Redis) -> bool:
    """Both preconditions of the crash, as Redis sees them."""
    clients = client.client_list()
    return bool(client.hlen("unacked")) and any(c.get("cmd") == "brpop" for c in clients)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pool,concurrency", [("threads", 4), ("prefork", 2)])
def test_a_worker_holding_an_unacked_step_survives_a_redis_restart_and_the_run_completes(
    pool: str, concurrency: int, db_url: str, own_redis: Path, tmp_path: Path
) -> None:
    url = embedded.ensure_running(own_redis, postgres=False)["redis"]
    model = MessagesSandbox(
        responder=agent_responder,
        latency_seconds=SLOW_MODEL,
        log_path=tmp_path / "messages.jsonl",
    ).start()
    env = {
        "NIGHTSHIFT_DATABASE_URL": db_url,
        "NIGHTSHIFT_BROKER_URL": url,
        "ANTHROPIC_API_KEY": "local-test-key",
        "ANTHROPIC_BASE_URL": model.url,
    }
    worker = CeleryProcess(
        "restart", tmp_path / "worker.log", env, concurrency=concurrency, pool=pool
    ).start()
    client = redis.Redis.from_url(url)
    try:
        # given a worker in the middle of a step (its message unacked) with a free slot polling
        started = subprocess.run(
            [NIGHTSHIFT, "start", "bench", "--input", json.dumps({"steps": 3}), "--json"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        run_id = uuid.UUID(json.loads(started.stdout)["run_id"])
        wait_for(lambda: holds_unacked_and_polls(client), timeout=30, what="an unacked step")

        # when Redis crashes and comes back on the same port
        kill_and_restart(own_redis, url)
        model.delay_seconds = 0.1

        # then the worker stays up, finishes the step it held and the run completes
        done = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}
        wait_for(
            lambda: worker.exited() or run_row(run_id).status in done,
            timeout=90,
            what="the run to finish",
        )
        log = worker.log()
        assert not worker.exited(), log[-3000:]
        assert "Unrecoverable error" not in log, log[-3000:]
        row = run_row(run_id)
        assert row.status == RunStatus.SUCCEEDED, row.error
        assert "Connection to broker lost" in log, "the restart was not seen: " + log[-3000:]
        assert row.step == 3
    finally:
        client.close()
        worker.stop()
        model.stop()
