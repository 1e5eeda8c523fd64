"""A worker host cut off from PostgreSQL for longer than the lease: another host takes its run
over within about a lease, the cut-off worker writes nothing once the network heals, and the
run's email goes out once.

Real worker processes on two worker hosts (tests/integration/worker_hosts.py). Needs root
(skipped, saying so, without it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from models import RunStatus
from pipeline.chaos.hosts import Host
from pipeline.processes.celery_process import CeleryProcess, wait_for
from tests.integration.worker_hosts import LEASE, TwoHosts, needs_hosts
from tests.support import run_row

pytestmark = needs_hosts
NIGHTSHIFT = str(Path(sys.executable).parent / "nightshift")
CUT_SECONDS = 5 * LEASE


def holder_host(run_id: uuid.UUID) -> str | None:
    owner = run_row(run_id).lease_owner
    return owner.split(":")[0] if owner else None


@pytest.mark.timeout(240)
def test_a_host_cut_off_from_postgres_loses_its_run_to_another_host_and_writes_nothing(
    two_hosts: TwoHosts, tmp_path: Path
) -> None:
    hosts = two_hosts.network.hosts
    processes = [
        CeleryProcess(
            f"w-{host.hostname}", tmp_path / f"{host.hostname}.log",
            {**two_hosts.env, **two_hosts.host_env}, concurrency=2, wrap=host.wrap(),
        ).start()
        for host in hosts
    ]  # fmt: skip
    processes.append(CeleryProcess("beat", tmp_path / "beat.log", two_hosts.env, beat=True).start())
    try:
        # given a nightly report run held by a worker on one of the hosts
        run_input = json.dumps({"team": "ops", "date": "2026-11-29"})
        started = subprocess.run(
            [NIGHTSHIFT, "start", "nightly_report", "--input", run_input, "--json"],
            env={**os.environ, **two_hosts.env}, capture_output=True, text=True, timeout=60,
            check=True,
        )  # fmt: skip
        run_id = uuid.UUID(json.loads(started.stdout)["run_id"])
        wait_for(lambda: run_row(run_id).step >= 1 and holder_host(run_id), timeout=60,
                 what="the run to be held in its second step")  # fmt: skip
        cut_off: Host = next(h for h in hosts if h.hostname == holder_host(run_id))
        fence = run_row(run_id).fence

        # when that host is cut off from PostgreSQL (both ways) for five leases
        port = urlsplit(two_hosts.urls["postgres"]).port
        assert port is not None
        cut_off.cut(port)
        cut_at = time.monotonic()

        try:
            # then the other host takes the run over while the cut lasts (the cut-off worker,
            # which still reaches Redis, hands back the step messages it cannot claim)
            wait_for(
                lambda: run_row(run_id).fence > fence and holder_host(run_id) != cut_off.hostname,
                timeout=CUT_SECONDS,
                interval=0.1,
                what="another host to take the run over",
            )
        finally:
            time.sleep(max(0.0, CUT_SECONDS - (time.monotonic() - cut_at)))
            cut_off.heal(port)

        # and the run finishes with its one email, nothing written by the cut-off worker
        row = wait_for(
            lambda: (
                run_row(run_id).status in (RunStatus.SUCCEEDED, RunStatus.FAILED)
                and run_row(run_id)
            ),
            timeout=120,
            what="the run to finish",
        )
        assert row.status == RunStatus.SUCCEEDED, row.error
        assert len(two_hosts.sandboxes.email.deliveries()) == 1
        for process in processes[:2]:
            assert not process.exited(), process.log()[-2000:]
    finally:
        for process in processes:
            process.stop()
