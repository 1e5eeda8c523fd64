"""A report written on one host is served by the API on another (issue 25's acceptance): a real
worker on one worker host (a network namespace with its own hostname and data dir) writes a
nightly report, and `nightshift api` on the other host, with a data dir of its own, serves it
to a client on this side. The two hosts share nothing but PostgreSQL and Redis.

Needs root (skipped, saying so, without it).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from models import RunStatus
from pipeline.processes.celery_process import CeleryProcess, wait_for
from tests.integration.api_fixtures import api_answers
from tests.integration.worker_hosts import TwoHosts, needs_hosts
from tests.servers import free_port
from tests.support import wait_for_status

pytestmark = needs_hosts
NIGHTSHIFT = str(Path(sys.executable).parent / "nightshift")
TOKEN = "artifact-hosts-token-not-secret-0123456789"


@pytest.mark.timeout(240)
def test_a_report_written_on_one_host_is_served_by_the_api_on_another(
    two_hosts: TwoHosts, tmp_path: Path
) -> None:
    writer, server = two_hosts.network.hosts
    worker_data, api_data = tmp_path / "writer-data", tmp_path / "server-data"
    worker = CeleryProcess(
        "w-writer", tmp_path / "writer.log",
        {**two_hosts.env, **two_hosts.host_env, "NIGHTSHIFT_DATA_DIR": str(worker_data)},
        concurrency=2, wrap=writer.wrap(),
    )  # fmt: skip
    port = free_port()
    api_env = {**os.environ, **two_hosts.env, **two_hosts.host_env,
               "NIGHTSHIFT_DATA_DIR": str(api_data), "NIGHTSHIFT_API_TOKEN": TOKEN}  # fmt: skip
    api_log = (tmp_path / "api.log").open("wb")
    api = subprocess.Popen(
        [*server.wrap(), NIGHTSHIFT, "api", "--host", "0.0.0.0", "--port", str(port)],
        env=api_env, stdout=api_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        worker.start()
        base = f"http://{server.address}:{port}"
        wait_for(lambda: api_answers(base), timeout=60, what="the API on the other host")

        # given a nightly report written by the worker on the writer host (started by a
        # process of its own: this one's Celery app was configured for the session's broker
        # by an earlier test, and sends to it for good)
        run_input = json.dumps({"team": "ops", "date": "2026-11-29"})
        started = subprocess.run(
            [NIGHTSHIFT, "start", "nightly_report", "--input", run_input, "--json"],
            env={**os.environ, **two_hosts.env}, capture_output=True, text=True, timeout=60,
            check=True,
        )  # fmt: skip
        run_id = uuid.UUID(json.loads(started.stdout)["run_id"])
        row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}, 120)
        assert row.status == RunStatus.SUCCEEDED, row.error
        report = row.result["state"]["artifacts"]["report"]
        assert str(run_id) in worker.log(), "the writer host's worker (the only one) ran it"

        # when a client asks the API on the other host for it, by the URL the result names
        auth = {"Authorization": f"Bearer {TOKEN}"}
        served = httpx.get(f"{base}{report['url']}", headers=auth, timeout=10)

        # then it is served whole, as the worker wrote it
        assert served.status_code == 200, served.text
        assert served.headers["content-type"] == "text/markdown; charset=utf-8"
        assert hashlib.sha256(served.content).hexdigest() == report["sha256"]
        assert served.text.startswith("# ") and len(served.content) == report["size"]
        # and the run as that API shows it lists the report under the same URL
        shown = httpx.get(f"{base}/runs/{run_id}", headers=auth, timeout=10).json()
        assert report["url"] in [a["url"] for a in shown["artifacts"]]
        # and neither host keeps a file of it
        for data_dir in (worker_data, api_data):
            assert not (data_dir / "artifacts").exists(), data_dir
    finally:
        worker.stop()
        api.terminate()
        try:
            api.wait(timeout=10)
        except subprocess.TimeoutExpired:
            api.kill()
        api_log.close()
