"""A night through Redis Sentinel (Debian's redis-server and its sentinel mode: a master, a
replica, three sentinels with quorum 2): its master is killed mid-night and the replica
promoted. Runs started by a plain Celery client (`.delay()` by task name, the master's name in
its transport options) before and after, on two real workers and beat that name only the
sentinels: every run succeeds, each report email is sent once, and both workers go on taking
steps from the new master. The same, smaller, with every server and sentinel speaking TLS only
(a CA and certificate made with openssl)."""

from __future__ import annotations

import re
import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from celery.exceptions import TimeoutError
from redis import Redis, RedisError

from models import RunStatus
from pipeline.chaos.sentinels import MASTER_NAME, Certificates, SentinelRedis
from pipeline.db import broker_client
from pipeline.settings import Settings, broker_urls
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.servers import certificates, need
from tests.support import run_row, wait_for

DONE = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.NEEDS_ATTENTION}
QUEUE = "nightshift"
RECEIVED = re.compile(r"Task pipeline\.step\[[0-9a-f-]+\] received")


def started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tls: Certificates | None = None
) -> SentinelRedis:
    """The cluster, named to every process the test starts by its sentinels alone."""
    program = need("redis-server")
    cluster = SentinelRedis(tmp_path / "redis", program, secrets.token_hex(12), tls=tls).start()
    monkeypatch.setenv("NIGHTSHIFT_BROKER_URL", cluster.url)
    monkeypatch.setenv("NIGHTSHIFT_BROKER_SENTINEL_MASTER", MASTER_NAME)
    monkeypatch.setenv("NIGHTSHIFT_QUEUE", QUEUE)
    if tls is not None:
        monkeypatch.setenv("NIGHTSHIFT_BROKER_SENTINEL_TLS", "1")
        monkeypatch.setenv("NIGHTSHIFT_BROKER_SENTINEL_TLS_CA", str(tls.ca))
    return cluster


@pytest.fixture
def sentinels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SentinelRedis]:
    cluster = started(tmp_path, monkeypatch)
    yield cluster
    cluster.stop()


@pytest.fixture
def tls_sentinels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SentinelRedis]:
    """Every server and sentinel on a TLS port only, with a certificate of a CA of the test's."""
    cluster = started(tmp_path, monkeypatch, certificates(tmp_path / "tls"))
    yield cluster
    cluster.stop()


def plain_client(url: str, tls: Certificates | None = None) -> Celery:
    """Another service's Celery, as docs/redis-sentinel.md configures it."""
    client = Celery("billing-service", broker=url, backend=url)
    options: dict[str, object] = {"master_name": MASTER_NAME}
    if tls is not None:
        verified = broker_urls.tls_options(tls.ca)
        options["sentinel_kwargs"] = {"ssl": True, **verified}
        client.conf.broker_use_ssl = verified
        client.conf.redis_backend_use_ssl = verified
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


def start_night(client: Celery, *, benches: int, steps: int, reports: int) -> tuple[list[str], ...]:
    """Every run started (`benches` of `steps` steps, and `reports` that each send an email) and
    the reports apart, once at least `reports` steps were taken."""
    runs = [start(client, "bench", {"steps": steps}, f"bench-{n}") for n in range(benches)]
    report_runs = [
        start(client, "nightly_report", {"team": f"team-{n}", "date": "2026-11-29"}, f"r-{n}")
        for n in range(reports)
    ]
    runs += report_runs
    wait_for(lambda: sum(run_row(r).step >= 1 for r in runs) >= reports, timeout=90, what="steps")
    return runs, report_runs


def night_succeeded(
    runs: list[str], reports: list[str], sandbox: Sandbox, cluster: SentinelRedis, timeout: float
) -> None:
    """Every run ends succeeded and each report's email went out once."""

    def finished() -> list[object] | None:
        rows = [run_row(run) for run in runs]
        return rows if all(row.status in DONE for row in rows) else None

    rows = wait_for(finished, timeout=timeout, interval=0.5, what="every run to finish")
    failed = {row.id: (row.status, row.error) for row in rows if row.status != RunStatus.SUCCEEDED}
    assert not failed, (failed, cluster.log()[-3000:])
    sent = Counter(delivery["key"] for delivery in sandbox.email.deliveries())
    assert len(sent) == len(reports) and set(sent.values()) == {1}, sent


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
    runs, reports = start_night(client, benches=8, steps=4, reports=4)

    # and the master dies mid-night and the sentinels promote the replica
    killed, promoted_after = sentinels.fail_over()
    assert sentinels.master_port() != killed
    received_before = [len(RECEIVED.findall(worker.log())) for worker in workers]

    # and the same client starts more runs afterwards, through the new master
    runs += [start(client, "bench", {"steps": 2}, f"after-{n}") for n in range(6)]

    # then every run of the night succeeds and each report's email went out once
    night_succeeded(runs, reports, sandbox, sentinels, timeout=200)

    # and both workers lived through it and took steps from the new master
    for worker, before in zip(workers, received_before, strict=True):
        log = worker.log()
        assert not worker.exited(), log[-3000:]
        assert len(RECEIVED.findall(log)) > before, (promoted_after, log[-3000:])


@pytest.mark.timeout(300)
def test_a_night_through_sentinel_over_tls_survives_a_master_failover(
    tls_sentinels: SentinelRedis, sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given servers and sentinels that speak TLS only: plain Redis gets no answer
    cluster = tls_sentinels
    plain = Redis(port=cluster.sentinel_ports[0], socket_timeout=2)
    with pytest.raises(RedisError), plain:
        plain.ping()
    # and a worker and beat that know only the sentinels, the CA and NIGHTSHIFT_BROKER_SENTINEL_TLS
    sandbox.messages.delay_seconds = 0.3
    sandbox.email.mode = "no-keys"
    worker = processes("w1", concurrency=4, wait=False)
    beat = processes("beat", beat=True, wait=False)
    wait_for(lambda: worker.ready() and beat.ready(), timeout=120, what="worker and beat")
    client = plain_client(cluster.url, cluster.tls)

    # when a plain Celery client starts runs over TLS, some of which send a report email
    runs, reports = start_night(client, benches=4, steps=3, reports=2)

    # and the master dies and the sentinels promote the replica
    killed, _ = cluster.fail_over()
    received_before = len(RECEIVED.findall(worker.log()))
    runs += [start(client, "bench", {"steps": 2}, f"after-{n}") for n in range(2)]

    # then every run succeeds and each report's email went out once
    night_succeeded(runs, reports, sandbox, cluster, timeout=150)

    # and the worker took steps from the new master, which nightshift's own client reaches too
    log = worker.log()
    assert not worker.exited(), log[-3000:]
    assert len(RECEIVED.findall(log)) > received_before, log[-3000:]
    with broker_client(Settings.from_env(), timeout=5) as own:
        assert own.ping()
        assert own.connection_pool.get_master_address()[1] != killed
