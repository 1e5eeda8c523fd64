"""Patch on real workers against a real repository (a bare repository standing in for the
remote, with a seeded bug and a failing test): it pushes nothing before the approval, then one
commit whose tests pass and one pull request, even with two runs of one issue racing; with the
real SDK the change pushed is the model's own. The git host speaks GitHub's REST API and wants
a token; a pull request already open for the branch is its 422, which Patch takes as done."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from models import Action, JournalEntry, RunStatus
from pipeline.db import transaction
from pipeline.runs.decisions import Decision, decide
from pipeline.runs.start import start_run
from pipeline.sandbox.git_repos import DEMO_REPO, has_branch, remote_path
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.sandbox.messages_api import MessagesSandbox
from pipeline.sandbox.responders import agent_responder
from pipeline.settings import get_settings
from tests.integration.api_fixtures import REVIEWER_ACTOR
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for, wait_for_status

BUG = {"issue": 42, "repo": DEMO_REPO, "title": "totals are not rounded"}
BRANCH = "patch/issue-42"
PR_KEY = f"patch:{DEMO_REPO}:{BRANCH}"
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}
TOKEN = "githost-token-not-secret"


@dataclass
class GitHost:
    api: GitHostSandbox
    remotes: Path

    def opened(self) -> list[dict[str, Any]]:
        return [e for e in self.api.log.entries() if e["action"] == "opened"]

    def pushed(self) -> bool:
        return has_branch(self.remotes, DEMO_REPO, BRANCH)

    def tests_pass_on(self, ref: str, scratch: Path) -> bool:
        """Clone the remote at `ref` and run its tests there, as a reviewer would."""
        checkout = scratch / f"review-{ref.replace('/', '-')}"
        bare = remote_path(self.remotes, DEMO_REPO)
        subprocess.run(["git", "clone", "-q", "-b", ref, str(bare), str(checkout)], check=True)
        ran = subprocess.run(["python", "-m", "unittest"], cwd=checkout, capture_output=True)
        return ran.returncode == 0


@pytest.fixture
def githost(
    db_url: str, git_remotes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[GitHost]:
    api = GitHostSandbox(
        log_path=tmp_path / "githost.jsonl", git_root=git_remotes, token=TOKEN
    ).start()
    monkeypatch.setenv("NIGHTSHIFT_GITHOST_URL", api.url)
    monkeypatch.setenv("NIGHTSHIFT_GITHOST_TOKEN", TOKEN)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the scripted model, unless told
    get_settings.cache_clear()
    yield GitHost(api, git_remotes)
    api.stop()


def journaled(run_id: Any, tool: str) -> dict[str, Any]:
    """The result the run's journal holds for its call of `tool`."""
    with transaction() as session:
        payloads = session.scalars(
            select(JournalEntry.payload).where(
                JournalEntry.run_id == run_id, JournalEntry.step_name == tool
            )
        ).all()
    (payload,) = payloads
    return json.loads(payload["content"])


def pull_args() -> dict[str, Any]:
    with transaction() as session:
        action = session.scalar(select(Action).where(Action.idempotency_key == PR_KEY))
        assert action is not None
        return dict(action.args)


def run_approved() -> tuple[Any, Any]:
    """Patch's run for BUG, its pull request approved once it waits; its id and final row."""
    run_id = start_run("patch", BUG).run_id
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=60)
    decide(PR_KEY, Decision.APPROVE, REVIEWER_ACTOR)
    return run_id, wait_for_status(run_id, DONE, timeout=60)


def test_patch_fixes_the_seeded_bug_and_pushes_only_after_the_approval(
    githost: GitHost, processes: ProcessFactory, tmp_path: Path
) -> None:
    # given the demo repository, whose test fails on main
    assert not githost.tests_pass_on("main", tmp_path)
    processes("w1")

    # when Patch works on the bug until it needs a person
    run_id = start_run("patch", BUG).run_id
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=60)

    # then it saw the test fail, changed the code, saw the tests pass, and pushed nothing
    assert journaled(run_id, "run_tests")["passed"] is False
    proposed = journaled(run_id, "propose_fix")
    assert proposed["tests"]["passed"] is True
    assert "+    total = round(price * quantity, 2)" in proposed["patch"]
    assert not githost.pushed() and githost.opened() == []
    # and the approver is shown exactly the change that will be pushed
    assert (pull_args()["base"], pull_args()["patch"]) == (proposed["base"], proposed["patch"])

    # when a person approves
    decide(PR_KEY, Decision.APPROVE, REVIEWER_ACTOR)
    row = wait_for_status(run_id, DONE, timeout=60)

    # then the branch is pushed, its tests pass, and one pull request is open for it
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert githost.pushed() and githost.tests_pass_on(BRANCH, tmp_path)
    assert [p["branch"] for p in githost.opened()] == [BRANCH]
    assert journaled(run_id, "open_fix_pull_request")["number"] == 1
    [pull] = githost.api.pulls(DEMO_REPO)
    assert (pull["head"]["ref"], pull["base"]["ref"]) == (BRANCH, "main")
    assert pull["title"] == "Fix #42: totals are not rounded"


def test_two_runs_of_one_issue_on_two_workers_open_one_pull_request(
    githost: GitHost, processes: ProcessFactory
) -> None:
    # given the same issue started twice (a duplicated event, say) and two workers
    processes("beat", beat=True)
    processes("w1")
    processes("w2")
    runs = [start_run("patch", BUG).run_id for _ in range(2)]
    parked = [
        wait_for_status(run_id, {RunStatus.WAITING.value, RunStatus.NEEDS_ATTENTION.value}, 60)
        for run_id in runs
    ]
    # then the run that recorded the pull request first waits for its approval; the other
    # does not wait on that approval as if it were its own (issue 13): it says whose key it is
    owner, other = sorted(parked, key=lambda row: row.status != RunStatus.WAITING)
    assert (owner.status, other.status) == (RunStatus.WAITING, RunStatus.NEEDS_ATTENTION)
    assert other.stop_reason == "key_conflict" and str(owner.id) in other.error

    # when the one pull request is approved
    decide(PR_KEY, Decision.APPROVE, REVIEWER_ACTOR)

    # then both runs end well (the other learns the outcome), one commit was pushed and one
    # pull request opened
    for run_id in runs:
        row = wait_for_status(run_id, DONE, timeout=60)
        assert row.status == RunStatus.SUCCEEDED, row.error
    assert len(githost.opened()) == 1
    bare = remote_path(githost.remotes, DEMO_REPO)
    commits = subprocess.run(["git", "rev-list", "--count", f"main..{BRANCH}"], cwd=bare,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert commits == "1\n"


def test_with_the_real_sdk_the_change_pushed_is_the_models_own(
    githost: GitHost,
    processes: ProcessFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a model (through the real SDK) that fixes the bug its own way: at the return
    def own_fix(request: dict[str, Any]) -> dict[str, Any]:
        reply = agent_responder(request)
        for block in reply["content"]:
            if block["type"] == "tool_use" and block["name"] == "propose_fix":
                edit = {"path": "shop/cart.py", "old": "    return total\n",
                        "new": "    return round(total, 2)  # cents\n"}  # fmt: skip
                block["input"] = {"edits": [edit]}
        return reply

    with MessagesSandbox(responder=own_fix, log_path=tmp_path / "messages.jsonl") as model:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-secret")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", model.url)
        processes("w1")
        _, row = run_approved()

    assert row.status == RunStatus.SUCCEEDED, row.error
    bare = remote_path(githost.remotes, DEMO_REPO)
    pushed = subprocess.run(["git", "show", f"{BRANCH}:shop/cart.py"], cwd=bare,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "return round(total, 2)  # cents" in pushed and "total = price * quantity" in pushed
    assert githost.tests_pass_on(BRANCH, tmp_path)
    wait_for(lambda: len(githost.opened()) == 1, timeout=5, what="one pull request")


def test_a_pull_request_already_open_for_the_branch_is_the_hosts_422_and_the_run_succeeds(
    db_url: str,
    git_remotes: Path,
    processes: ProcessFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a host (no git behind it: any branch may be opened) where a person already opened a
    # pull request from the issue's branch
    with GitHostSandbox(log_path=tmp_path / "githost.jsonl", token=TOKEN) as api:
        monkeypatch.setenv("NIGHTSHIFT_GITHOST_URL", api.url)
        monkeypatch.setenv("NIGHTSHIFT_GITHOST_TOKEN", TOKEN)
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
        get_settings.cache_clear()
        by_hand = {"title": "WIP", "head": f"acme:{BRANCH}", "base": "main"}
        auth = {"Authorization": f"Bearer {TOKEN}"}
        opened = httpx.post(f"{api.url}/repos/{DEMO_REPO}/pulls", json=by_hand, headers=auth)
        assert opened.status_code == 201
        processes("w1")

        # when Patch's approved pull request is sent
        run_id, row = run_approved()

        # then the host refused a second one (422), Patch took the open one as its result, and
        # the run succeeded with one pull request on the host
        assert row.status == RunStatus.SUCCEEDED, row.error
        result = journaled(run_id, "open_fix_pull_request")
        assert (result["number"], result["already_open"]) == (1, True)
        assert [p["number"] for p in api.pulls(DEMO_REPO)] == [1]
        assert [e["action"] for e in api.log.entries()] == ["opened"]
