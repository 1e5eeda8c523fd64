"""A night through Redis Sentinel (Debian's redis-server and its sentinel mode: a master, a
replica, three sentinels with quorum 2): its master is killed mid-night and the replica
promoted. Runs started by a plain Celery client (`.delay()` by task name, the master's name in
its transport options) before and after, on two real workers and beat that name only the
sentinels: every run succeeds, each report email is sent once, and both workers go on taking
steps from the new master."""

from __future__ import annotations

import re
import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from celery.exceptions import TimeoutError

from models import RunStatus
from pipeline.chaos.sentinels import MASTER_NAME, SentinelRedis
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.servers import need
from tests.support import run_row, wait_for

DONE = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.NEEDS_ATTENTION}
QUEUE = "nightshift"
RECEIVED = re.compile(r"Task pipeline\.step\[[0-9a-f-]+\] received")


@pytest.fixture
def sentinels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SentinelRedis]:
    """The cluster, named to every process this test starts by its sentinels alone."""
    cluster = SentinelRedis(tmp_path / "redis", need("redis-server"), secrets.token_hex(12))
    cluster.start()
    monkeypatch.setenv("NIGHTSHIFT_BROKER_URL", cluster.url)
    monkeypatch.setenv("NIGHTSHIFT_BROKER_SENTINEL_MASTER", MASTER_NAME)
    monkeypatch.setenv("NIGHTSHIFT_QUEUE", QUEUE)
    yield cluster
    cluster.stop()


def plain_client(url: str) -> Celery:
    """Another service's Celery, as docs/redis-sentinel.md configures it."""
    client = Celery("billing-service", broker=url, backend=url)
    options = {"master_name": MASTER_NAME}
    client.conf.broker_transport_options = options
    client.conf.result_backend_transport_options = options
    return client


def start(client: Celery, agent: str, request: dict[str, object], key: str) -> str:
    """The run id, as docs/redis-sentinel.md tells a client to get it: an answer stored just as
    the master died is lost (celery/celery#8588), so a request not answered in time is sent
    again under the same key, which answers with the run the first one started."""
    for wait in (60, 90):
        sent = client.send_task("pipeline.start_run", args=[agent, request, key], queue=QUEUE)
        try:
            return str(sent.get(timeout=wait))
        except TimeoutError:
            continue
    raise AssertionError(f"no run id for {key} after sending it twice")


@pytest.mark.timeout(360)
def test_a_night_through_sentinel_survives_a_master_failover(
    sentinels: SentinelRedis, sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given two workers and beat that know only the sentinels, a model that takes a moment,
    # and an email service that would deliver a second send of a key
    sandbox.messages.delay_seconds = 0.3
    sandbox.email.mode = "no-keys"
    workers = [processes(name, concurrency=4, wait=False) for name in ("w1", "w2")]
    started = [*workers, processes("beat", beat=True, wait=False)]
    wait_for(lambda: all(p.ready() for p in started), timeout=120, what="workers and beat")
    client = plain_client(sentinels.url)

    # when a plain Celery client starts a night of runs, some of which send a report email
    runs = [start(client, "bench", {"steps": 4}, f"bench-{n}") for n in range(8)]
    reports = [
        start(client, "nightly_report", {"team": f"team-{n}", "date": "2026-11-29"}, f"r-{n}")
        for n in range(4)
    ]
    runs += reports
    wait_for(
        lambda: sum(run_row(run).step >= 1 for run in runs) >= 4, timeout=90, what="steps done"
    )

    # and the master dies mid-night and the sentinels promote the replica
    killed, promoted_after = sentinels.fail_over()
    assert sentinels.master_port() != killed
    received_before = [len(RECEIVED.findall(worker.log())) for worker in workers]

    # and the same client starts more runs afterwards, through the new master
    runs += [start(client, "bench", {"steps": 2}, f"after-{n}") for n in range(6)]

    # then every run of the night succeeds
    def finished() -> list[object] | None:
        rows = [run_row(run) for run in runs]
        return rows if all(row.status in DONE for row in rows) else None

    rows = wait_for(finished, timeout=200, interval=0.5, what="every run to finish")
    failed = {row.id: (row.status, row.error) for row in rows if row.status != RunStatus.SUCCEEDED}
    assert not failed, (failed, sentinels.log()[-3000:])

    # and each report's email went out once
    sent = Counter(delivery["key"] for delivery in sandbox.email.deliveries())
    assert len(sent) == len(reports) and set(sent.values()) == {1}, sent

    # and both workers lived through it and took steps from the new master
    for worker, before in zip(workers, received_before, strict=True):
        log = worker.log()
        assert not worker.exited(), log[-3000:]
        assert len(RECEIVED.findall(log)) > before, (promoted_after, log[-3000:])
