"""The approval webhook fired twice at the same moment, with a valid signature, against a live
server and a real worker: one decision, one pull request."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from models import RunStatus
from pipeline.runs.start import start_run
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.settings import get_settings
from tests.integration.api_fixtures import BUG, PR_KEY, live_server, make_app, signed
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for_status


def test_the_approval_webhook_fired_twice_at_once_opens_one_pull_request(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: ProcessFactory
) -> None:
    githost = GitHostSandbox(log_path=tmp_path / "githost.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_GITHOST_URL", githost.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    get_settings.cache_clear()
    processes("w1")
    run_id = start_run("patch", BUG).run_id
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=30)

    with live_server(make_app()) as base:
        request = signed({"decision": "approve", "by": "alice@example.com"})
        barrier = threading.Barrier(2)
        answers: list[httpx.Response] = []

        def fire() -> None:
            barrier.wait()
            answers.append(httpx.post(f"{base}/approvals/{PR_KEY}", timeout=10, **request))

        threads = [threading.Thread(target=fire) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert [a.status_code for a in answers] == [200, 200]
    assert sorted(a.json()["first"] for a in answers) == [False, True]
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}, 60)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert len([e for e in githost.log.entries() if e["action"] == "opened"]) == 1
    githost.stop()
