"""Issue 31, against a live API (uvicorn on a socket) and a real worker: Patch's pull-request
key is the run's issue's (its input's repository and issue branch), so a hostile model cannot
reserve another issue's pull request and make that issue's run park."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from models import ActionState, RunStatus
from pipeline.sandbox.git_repos import DEMO_REPO
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.sandbox.messages_api import MessagesSandbox
from pipeline.sandbox.responders import agent_responder
from pipeline.settings import get_settings
from tests.integration.api_fixtures import (
    action_row,
    live_server,
    make_app,
    person_token,
    start_as,
)
from tests.integration.conftest import ProcessFactory
from tests.support import run_row, wait_for_status

PARKED = {RunStatus.WAITING.value, RunStatus.NEEDS_ATTENTION.value}
ENDED = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}
REAL = {"issue": 424242, "repo": DEMO_REPO, "title": "totals are not rounded"}
HOSTILE = {"issue": 7, "repo": DEMO_REPO, "title": "a typo in the README"}
REAL_KEY = f"patch:{DEMO_REPO}:patch/issue-424242"


def _model_for_issue_7_aims_at_424242(request: dict[str, Any]) -> dict[str, Any]:
    """The scripted Patch model, except that in the run for issue 7 it asks to open the pull
    request on issue 424242's branch (the repository is the same)."""
    reply = agent_responder(request)
    if '"issue": 7,' not in str(request["messages"][0]["content"]):
        return reply
    for block in reply["content"]:
        if block["type"] == "tool_use" and block["name"] == "open_fix_pull_request":
            block["input"] = {**block["input"], "branch": "patch/issue-424242"}
    return reply


def test_a_hostile_model_cannot_reserve_another_issues_pull_request_key(
    githost: GitHostSandbox,
    git_remotes: Path,
    processes: ProcessFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    messages = tmp_path / "messages.jsonl"
    with MessagesSandbox(responder=_model_for_issue_7_aims_at_424242, log_path=messages) as model:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-secret")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", model.url)
        get_settings.cache_clear()
        processes("w1")
        with live_server(make_app()) as base:
            # given the run for issue 7, whose model names issue 424242's branch for its pull
            # request, started first by someone
            hostile = start_as(base, person_token("mallory@example.com"), "patch", HOSTILE)
            hostile_row = wait_for_status(hostile, PARKED | ENDED, timeout=90)
            # when the real run for issue 424242 starts and reaches its pull request
            real = start_as(base, person_token(), "patch", REAL)
            real_row = wait_for_status(real, PARKED | ENDED, timeout=90)

    # then the real run waits for the approval of its own pull request, under its own key
    assert (real_row.status, real_row.waiting_on) == (
        RunStatus.WAITING,
        f"approval:{REAL_KEY}",
    ), real_row.error
    owned = action_row(REAL_KEY)
    assert (owned.run_id, owned.state) == (real, ActionState.PENDING_APPROVAL)
    assert owned.args["branch"] == "patch/issue-424242"
    # and the hostile call was refused before anything was recorded: no reviewer is asked to
    # open a pull request for another issue, and its run took no key
    assert hostile_row.status is RunStatus.SUCCEEDED, hostile_row.error
    assert "may open a pull request only for patch/issue-7" in str(run_row(hostile).result)
    assert githost.log.entries() == []
