"""A PostgreSQL failover mid-night: the primary stopped like a crash while report emails are
being sent, its synchronous standby promoted, every process on a URL naming both hosts with
`target_session_attrs=read-write`. Every run succeeds, each email is sent once (the service
sends every request: a second send would show), no acknowledged commit is lost, and the runs
move again within seconds (the time is printed).

tests/servers.py's kin for this one is pipeline/chaos/postgres_pair.py, which the chaos
harness's `failover` fault uses too."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from bench.commit_probe import CommitProbe
from models import RunStatus
from pipeline.chaos.postgres_pair import PostgresPair
from pipeline.db import dispose_all, transaction
from pipeline.migrate import upgrade
from pipeline.runs.start import start_run
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import run_row, wait_for

READ_ONLY_RUNS = 10
REPORT_RUNS = 10
DONE = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.NEEDS_ATTENTION}


@pytest.fixture
def pair(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[PostgresPair]:
    """A primary and its synchronous standby, migrated; every process of the test uses both."""
    root = Path(tempfile.mkdtemp(prefix="nightshift-pair-", dir="/tmp"))
    root.chmod(0o755)  # the servers' system user reaches its data through it
    servers = PostgresPair(root, synchronous=True)
    try:
        servers.start()
        upgrade(servers.url())
        monkeypatch.setenv("NIGHTSHIFT_DATABASE_URL", servers.url())
        yield servers
    finally:
        dispose_all()
        servers.stop()
        shutil.rmtree(root, ignore_errors=True)


def steps_taken() -> int:
    with transaction() as session:
        return int(session.execute(text("SELECT coalesce(sum(step), 0) FROM runs")).scalar_one())


def an_email_in_flight() -> bool:
    with transaction() as session:
        query = "SELECT count(*) FROM actions WHERE state = 'attempted' AND service = 'email'"
        return bool(session.execute(text(query)).scalar_one())


@pytest.mark.timeout(300)
def test_a_failover_to_a_synchronous_standby_loses_no_commit_and_sends_each_email_once(
    pair: PostgresPair, sandbox: Sandbox, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given two workers and beat on both hosts, a model that takes a moment, and an email
    # service that sends every request (a second send of a key would be a second email) and
    # can say what it sent under a key, configured as such
    sandbox.messages.delay_seconds = 0.3
    sandbox.email.mode = "no-keys-lookup"
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", "lookup")
    sandbox.email.delay_seconds = 0.5
    processes("w1", concurrency=4)
    processes("w2", concurrency=4)
    processes("beat", beat=True)
    with CommitProbe(pair.url("postgres")) as probe:
        # when a night of read-only runs and runs that each send a report email starts
        runs = [start_run("bench", {"steps": 5}).run_id for _ in range(READ_ONLY_RUNS)]
        runs += [
            start_run("nightly_report", {"team": f"team-{n}", "date": "2026-11-29"}).run_id
            for n in range(REPORT_RUNS)
        ]

        # and the primary stops like a crash while an email is being sent, and the standby
        # is promoted
        wait_for(an_email_in_flight, timeout=60, interval=0.05, what="an email send in flight")
        before = steps_taken()
        failover = pair.fail_over()
        stopped = failover.stopped_at
        dispose_all()  # this process's pool: its connections went with the old primary

        # then the runs move again on the new primary
        wait_for(lambda: steps_taken() > before, timeout=60, interval=0.1, what="a step")
        resumed_after = time.monotonic() - stopped
        first_commit = next(at for _, at in probe.acknowledged if at > stopped) - stopped

        # and every run of the night succeeds
        def finished() -> list[object] | None:
            rows = [run_row(run_id) for run_id in runs]
            return rows if all(row.status in DONE for row in rows) else None

        rows = wait_for(finished, timeout=180, interval=0.5, what="every run to finish")
    print(
        f"\nfailover: promoted {failover.seconds:.2f}s after the stop, first commit after "
        f"{first_commit:.2f}s, first step after {resumed_after:.2f}s"
    )
    failed = {row.id: (row.status, row.error) for row in rows if row.status != RunStatus.SUCCEEDED}
    assert not failed, failed

    # and each report's email went out once
    sent = Counter(delivery["key"] for delivery in sandbox.email.deliveries())
    assert len(sent) == REPORT_RUNS, sent
    assert set(sent.values()) == {1}, sent

    # and every commit PostgreSQL acknowledged before the stop is on the new primary
    acknowledged = {n for n, _ in probe.acknowledged}
    assert acknowledged - probe.kept() == set()
    assert any(at < stopped for _, at in probe.acknowledged)
    assert resumed_after < 60
