"""`nightshift services env` and `services down` on the embedded default: the exports let a
plain Celery client start a run, and stopping refuses while clients are connected."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from celery import Celery

from pipeline import embedded
from pipeline.processes.celery_process import CeleryProcess

NIGHTSHIFT = str(Path(sys.executable).with_name("nightshift"))


@pytest.fixture
def embedded_env() -> Iterator[dict[str, str]]:
    """An environment with no service URLs and a data dir of its own (not tmp_path: the
    postgres user must traverse it)."""
    data_dir = Path(tempfile.mkdtemp(prefix="nightshift-services-")) / "data"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NIGHTSHIFT_DATABASE_URL", "NIGHTSHIFT_BROKER_URL")
    }
    env["NIGHTSHIFT_DATA_DIR"] = str(data_dir)
    yield env
    embedded.stop(data_dir)
    shutil.rmtree(data_dir.parent)


def nightshift(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([NIGHTSHIFT, *args], env=env, capture_output=True, text=True, timeout=120)


def exports(output: str) -> dict[str, str]:
    found = {}
    for line in output.splitlines():
        word, assignment = shlex.split(line)
        assert word == "export"
        name, value = assignment.split("=", 1)
        found[name] = value
    return found


def test_services_env_lets_a_plain_celery_client_start_a_run(
    embedded_env: dict[str, str], tmp_path: Path
) -> None:
    # given the embedded default, when a shell takes `nightshift services env`
    printed = nightshift(embedded_env, "services", "env")
    assert printed.returncode == 0, printed.stderr
    urls = exports(printed.stdout)
    assert set(urls) == {"NIGHTSHIFT_DATABASE_URL", "NIGHTSHIFT_BROKER_URL", "NIGHTSHIFT_QUEUE"}
    assert "***" not in urls["NIGHTSHIFT_BROKER_URL"]
    assert nightshift(embedded_env | urls, "migrate").returncode == 0
    worker = CeleryProcess(name="w1", log_path=tmp_path / "w1.log", env=embedded_env | urls).start()
    try:
        # then a client with nothing but Celery and those URLs starts a run and gets its id
        client = Celery(broker=urls["NIGHTSHIFT_BROKER_URL"], backend=urls["NIGHTSHIFT_BROKER_URL"])
        sent = client.send_task(
            "pipeline.start_run",
            args=["nightly_report", {"team": "ops", "date": "2026-11-29"}],
            queue=urls["NIGHTSHIFT_QUEUE"],
        )
        run_id = sent.get(timeout=60)
        database = urls["NIGHTSHIFT_DATABASE_URL"].replace("+psycopg", "")
        with psycopg.connect(database) as conn:
            row = conn.execute("SELECT agent FROM runs WHERE id = %s", (run_id,)).fetchone()
        assert row == ("nightly_report",)
        client.close()
    finally:
        worker.stop()


def test_services_down_refuses_while_clients_are_connected(embedded_env: dict[str, str]) -> None:
    # given the embedded services with a client connected to PostgreSQL
    assert nightshift(embedded_env, "services", "up").returncode == 0
    urls = exports(nightshift(embedded_env, "services", "env").stdout)
    with psycopg.connect(urls["NIGHTSHIFT_DATABASE_URL"].replace("+psycopg", "")):
        # when someone stops them, then they are told, in one line, and nothing stops
        refused = nightshift(embedded_env, "services", "down")
        assert refused.returncode == 2
        assert refused.stdout.count("\n") == 1
        assert "1 client of postgres connected" in refused.stdout and "--force" in refused.stdout
        assert all(
            info.running for info in embedded.status(Path(embedded_env["NIGHTSHIFT_DATA_DIR"]))
        )
        # and --force stops them anyway
        forced = nightshift(embedded_env, "services", "down", "--force")
        assert forced.returncode == 0, forced.stderr
    assert not any(i.running for i in embedded.status(Path(embedded_env["NIGHTSHIFT_DATA_DIR"])))
