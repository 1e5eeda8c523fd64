"""A night through PgBouncer in transaction mode (Debian's package, docs/operations.md's
settings), with a worker SIGKILLed mid-night and replaced: every run succeeds, each report
email is sent once, and no worker meets a prepared statement another server connection
does not have.

The pool has two server connections for two workers, beat and this process: consecutive
transactions of one client connection run on different server connections, so anything that
relied on session state (a prepared statement, a session SET, a lock held between
transactions) would break here.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

from models import RunStatus
from pipeline.runs.start import start_run
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.servers import PgBouncer
from tests.support import ServiceUrls, nightshift, run_row, wait_for

READ_ONLY_RUNS = 20
REPORT_RUNS = 10
DONE = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.NEEDS_ATTENTION}


@pytest.fixture
def pgbouncer(
    services: ServiceUrls, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PgBouncer]:
    """PgBouncer in front of this test's database; every process of the test goes through it.
    The idle-in-transaction timeout nightshift sends as a startup option is dropped by the
    pooler, so the database carries it, as docs/operations.md says to do for the role."""
    database = str(make_url(db_url).database)
    with psycopg.connect(services.admin_conninfo(database), autocommit=True) as connection:
        connection.execute(
            f"ALTER DATABASE {database} SET idle_in_transaction_session_timeout = '4s'"
        )
    bouncer = PgBouncer(services.database).start()
    monkeypatch.setenv("NIGHTSHIFT_DATABASE_URL", bouncer.url(database))
    yield bouncer
    bouncer.stop()


class PoolWatch:
    """Samples PgBouncer's pool while the night runs: how many clients shared how many server
    connections at most."""

    def __init__(self, bouncer: PgBouncer) -> None:
        self.bouncer = bouncer
        self.most_clients = 0
        self.most_servers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PoolWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            for pool in self.bouncer.admin("SHOW POOLS"):
                if pool["database"] == "pgbouncer":
                    continue
                clients = int(pool["cl_active"]) + int(pool["cl_waiting"])  # type: ignore[call-overload]
                servers = sum(int(pool[k]) for k in ("sv_active", "sv_idle", "sv_used"))  # type: ignore[call-overload]
                self.most_clients = max(self.most_clients, clients)
                self.most_servers = max(self.most_servers, servers)


def holder_pid(run_id: object) -> int | None:
    owner = run_row(run_id).lease_owner  # type: ignore[arg-type]
    return int(owner.split(":")[1]) if owner else None


@pytest.mark.timeout(300)
def test_a_night_through_pgbouncer_survives_a_killed_worker_and_sends_each_email_once(
    pgbouncer: PgBouncer, sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given two workers and beat, all through PgBouncer in transaction mode, a model that
    # takes a moment, and an email service that would deliver a second send of a key
    sandbox.messages.delay_seconds = 0.3
    sandbox.email.mode = "no-keys"
    workers = [processes("w1", concurrency=4), processes("w2", concurrency=4)]
    processes("beat", beat=True)
    with PoolWatch(pgbouncer) as pool:
        # when a night of read-only runs and runs that each send a report email starts
        read_only = [start_run("bench", {"steps": 4}).run_id for _ in range(READ_ONLY_RUNS)]
        reports = [
            start_run("nightly_report", {"team": f"team-{n}", "date": "2026-11-29"}).run_id
            for n in range(REPORT_RUNS)
        ]
        runs = read_only + reports

        # and a worker holding a report run in its second step is killed, and replaced
        def a_report_in_flight() -> int | None:
            for run_id in reports:
                pid = holder_pid(run_id)
                if pid and run_row(run_id).step >= 1:
                    return pid
            return None

        victim_pid = wait_for(a_report_in_flight, timeout=60, what="a report run in flight")
        victim = next(w for w in workers if w.pid == victim_pid)
        victim.kill()
        workers.append(processes("w3", concurrency=4))

        # then every run of the night succeeds
        def finished() -> list[object] | None:
            rows = [run_row(run_id) for run_id in runs]
            return rows if all(row.status in DONE for row in rows) else None

        rows = wait_for(finished, timeout=180, interval=0.5, what="every run to finish")
    failed = {row.id: (row.status, row.error) for row in rows if row.status != RunStatus.SUCCEEDED}
    assert not failed, failed

    # and each report's email went out once
    sent = Counter(delivery["key"] for delivery in sandbox.email.deliveries())
    assert len(sent) == REPORT_RUNS, sent
    assert set(sent.values()) == {1}, sent

    # and no statement met a server connection that lacked its preparation (or had another
    # statement's under the same name), though the clients far outnumbered the connections
    for process in workers:
        log = process.log()
        assert "prepared statement" not in log, log[-3000:]
    assert pool.most_servers <= pgbouncer.pool_size
    assert pool.most_clients > pool.most_servers, (pool.most_clients, pool.most_servers)


def test_a_wait_behind_pgbouncer_says_what_to_set_and_listens_on_the_direct_url(
    pgbouncer: PgBouncer, db_url: str, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a worker through PgBouncer and the scripted model
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    processes("w1")
    run = ("start", "bench", "--input", '{"steps": 2}', "--wait", "--json")

    # when a run is started and waited for through the pooler alone, it still ends, and the
    # command says in one line why it could not listen and what to set
    through = nightshift(*run)
    assert through.returncode == 0, through.stderr
    lines = through.stderr.splitlines()
    said = [line for line in lines if "NIGHTSHIFT_DATABASE_DIRECT_URL" in line]
    assert len(said) == 1, through.stderr
    assert "NIGHTSHIFT_DATABASE_URL goes through a connection pooler" in said[0]

    # and with the direct URL set it listens there, saying nothing
    direct = nightshift(*run, NIGHTSHIFT_DATABASE_DIRECT_URL=db_url)
    assert direct.returncode == 0, direct.stderr
    assert "pooler" not in direct.stderr, direct.stderr
