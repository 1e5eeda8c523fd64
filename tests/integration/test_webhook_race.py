"""The approval webhook fired twice at the same moment against a live server and a real
worker: the same delivery twice (one accepted, the replay refused) and two deliveries signed
apart (one decision, the other told it repeated it): one pull request."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from models import RunStatus
from pipeline.runs.start import start_run
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.settings import get_settings
from tests.integration.api_fixtures import (
    BUG,
    PR_KEY,
    action_row,
    as_seen,
    live_server,
    make_app,
    person_token,
    signed,
)
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for_status


def test_the_approval_webhook_fired_twice_at_once_opens_one_pull_request(
    db_url: str,
    git_remotes: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    processes: ProcessFactory,
) -> None:
    githost = GitHostSandbox(log_path=tmp_path / "githost.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_GITHOST_URL", githost.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    get_settings.cache_clear()
    # a worker configured, as a deployment would be, to let only Alice open pull requests
    processes("w1", env={"NIGHTSHIFT_APPROVERS_OPEN_FIX_PULL_REQUEST": "alice@example.com"})
    run_id = start_run("patch", BUG).run_id
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=30)

    path = f"/approvals/{PR_KEY}"
    body = {"decision": "approve", **as_seen()}
    alice = person_token("alice@example.com")
    with live_server(make_app()) as base:
        # the tool's default reviewer is not the configured approver: refused, nothing named
        reviewer = signed(path, body, token=person_token("reviewer@example.com"))
        refused = httpx.post(f"{base}{path}", timeout=10, **reviewer)
        # the same delivery twice at once (a sender's retry, or a capture replayed)
        same = signed(path, body, token=alice)
        duplicated = fire_at_once(f"{base}{path}", [same, same])
        # two deliveries signed apart, at once (two buttons pressed)
        apart = [signed(path, body, token=alice, now=time.time() + i) for i in (1, 2)]
        separate = fire_at_once(f"{base}{path}", apart)

    assert refused.status_code == 403 and "alice" not in refused.text

    assert sorted(a.status_code for a in duplicated) == [200, 401]
    assert [a.json()["first"] for a in duplicated if a.status_code == 200] == [True]
    assert [a.status_code for a in separate] == [200, 200]
    assert [a.json()["first"] for a in separate] == [False, False]
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}, 60)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert len([e for e in githost.log.entries() if e["action"] == "opened"]) == 1
    assert action_row().decided_by == "alice@example.com"
    githost.stop()


def fire_at_once(url: str, requests: list[dict]) -> list[httpx.Response]:
    barrier = threading.Barrier(len(requests))
    answers: list[httpx.Response] = []

    def fire(request: dict) -> None:
        barrier.wait()
        answers.append(httpx.post(url, timeout=10, **request))

    threads = [threading.Thread(target=fire, args=(r,)) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers
