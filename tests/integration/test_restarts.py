"""A run waiting for approval survives a restart of every worker, beat, Redis and PostgreSQL.

Runs on embedded services of its own (a temporary data directory) so that it can stop and
start them; the machine's own PostgreSQL and Redis are not touched.
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

from models import RunStatus
from pipeline import embedded
from pipeline.db import dispose_all
from pipeline.migrate import upgrade
from pipeline.processes.celery_process import CeleryProcess
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.settings import get_settings
from tests.support import run_row, wait_for_status

BUG = {"issue": 7, "repo": "acme/shop", "title": "totals are not rounded"}
NIGHTSHIFT = str(Path(sys.executable).parent / "nightshift")


@pytest.fixture
def own_services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Directly under /tmp: as root, the postgres system user must be able to reach it.
    data_dir = Path(tempfile.mkdtemp(prefix="nightshift-restart-", dir="/tmp"))
    yield data_dir
    dispose_all()
    embedded.stop(data_dir)
    shutil.rmtree(data_dir, ignore_errors=True)


def point_at(urls: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTSHIFT_DATABASE_URL", urls["postgres"])
    monkeypatch.setenv("NIGHTSHIFT_BROKER_URL", urls["redis"])
    get_settings.cache_clear()
    dispose_all()


def nightshift(*args: str) -> str:
    result = subprocess.run(
        [NIGHTSHIFT, *args], env=dict(os.environ), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_run_waiting_for_approval_survives_restarting_everything(
    own_services: Path, git_remotes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    githost = GitHostSandbox(log_path=tmp_path / "githost.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_GITHOST_URL", githost.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    point_at(embedded.ensure_running(own_services), monkeypatch)
    upgrade()

    def start_everything(tag: str) -> list[CeleryProcess]:
        return [
            CeleryProcess(name=f"worker-{tag}", log_path=tmp_path / f"worker-{tag}.log").start(),
            CeleryProcess(name=f"beat-{tag}", log_path=tmp_path / f"beat-{tag}.log", beat=True)
            .start(),
        ]  # fmt: skip

    # given a Patch run waiting for a person's approval
    processes = start_everything("before")
    started = json.loads(nightshift("start", "patch", "--input", json.dumps(BUG), "--json"))
    run_id = uuid.UUID(started["run_id"])
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=60)

    # when every worker and beat stop, and Redis and PostgreSQL restart
    for process in processes:
        process.stop()
    dispose_all()
    stopped = {info.name for info in embedded.stop(own_services)}
    assert stopped == {"postgres", "redis"}
    point_at(embedded.ensure_running(own_services), monkeypatch)
    processes = start_everything("after")
    assert run_row(run_id).status == RunStatus.WAITING

    # then the approval, given after the restart, completes the run with one pull request
    nightshift("approve", "patch:acme/shop:patch/issue-7", "--as", "reviewer@example.com")
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}, 60)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert len([e for e in githost.log.entries() if e["action"] == "opened"]) == 1
    for process in processes:
        process.stop()
    githost.stop()
