"""Patch's tools against a real bare repository with a seeded bug: they read, test, change,
commit and push for real, and nothing the model writes takes them outside the run's own
worktree, branch and repository."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from pipeline.agents import gitwork, patch, services
from pipeline.errors import PermanentError
from pipeline.sandbox.git_repos import (
    DEMO_FILE,
    DEMO_FILES,
    DEMO_REPO,
    create_repository,
    has_branch,
    remote_path,
    seed_demo_repository,
    url_template,
)
from pipeline.settings import Settings
from pipeline.tools import ToolContext

BUG = {"issue": 42, "repo": DEMO_REPO, "title": "totals are not rounded", "file": DEMO_FILE}
FIX = {
    "path": DEMO_FILE,
    "old": "    total = price * quantity\n",
    "new": "    total = round(price * quantity, 2)\n",
}


@pytest.fixture
def remotes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "remotes"
    seed_demo_repository(root)
    monkeypatch.setenv(patch.GIT_URL, url_template(root))
    monkeypatch.delenv(patch.TEST_COMMAND, raising=False)
    return root


def context(tmp_path: Path, run_input: dict[str, Any] | None = None) -> ToolContext:
    settings = Settings.from_env({**os.environ, "NIGHTSHIFT_DATA_DIR": str(tmp_path / "data")})
    return ToolContext(uuid.uuid4(), "patch", "toolu_1", settings, run_input or BUG)


def call(tool: Any, args: dict[str, Any], tmp_path: Path, **kwargs: Any) -> Any:
    problems = tool.argument_errors(args)
    if problems:
        raise PermanentError("; ".join(problems))
    return tool.fn(args, context(tmp_path, **kwargs))


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


def test_the_tools_read_test_and_change_the_seeded_repository(remotes: Path, tmp_path: Path):
    listed = call(patch.list_files, {}, tmp_path)
    assert DEMO_FILE in listed["files"] and "tests/test_cart.py" in listed["files"]
    read = call(patch.read_file, {"path": DEMO_FILE}, tmp_path)
    assert read["content"] == DEMO_FILES[DEMO_FILE] and read["base"] == listed["base"]
    before = call(patch.run_tests, {}, tmp_path)
    assert before["passed"] is False and "test_a_total_is_in_cents" in before["output"]

    proposed = call(patch.propose_fix, {"edits": [FIX]}, tmp_path)

    assert proposed["tests"]["passed"] is True, proposed["tests"]["output"]
    assert proposed["base"] == read["base"]
    assert "+    total = round(price * quantity, 2)" in proposed["patch"]
    assert not has_branch(remotes, DEMO_REPO, "patch/issue-42"), "nothing is pushed by a proposal"


def test_the_scripted_model_finds_the_seeded_bug(remotes: Path, tmp_path: Path) -> None:
    read = call(patch.read_file, {"path": DEMO_FILE}, tmp_path)
    assert patch._rounding_fix(read["content"]) == (
        FIX["old"].rstrip("\n"),
        FIX["new"].rstrip("\n"),
    )


def test_opening_the_pull_request_pushes_one_deterministic_commit(
    remotes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a tested change, and a git host that records what it is asked to open
    proposed = call(patch.propose_fix, {"edits": [FIX]}, tmp_path)
    opened: list[tuple[str, str, str]] = []

    def open_pull(
        context: ToolContext, repo: str, branch: str, into: str, title: str, body: str
    ) -> Any:
        opened.append((repo, branch, into))
        return {"number": len(opened), "branch": branch}

    monkeypatch.setattr(patch, "open_pull_request", open_pull)
    args = {
        "repo": DEMO_REPO, "branch": "patch/issue-42", "title": "Fix #42", "body": "Rounds.",
        "base": proposed["base"], "patch": proposed["patch"],
    }  # fmt: skip

    # when it is sent, and sent again as after a crash (from another worker's directory)
    first = call(patch.open_fix_pull_request, args, tmp_path)
    again = call(patch.open_fix_pull_request, args, tmp_path / "other-worker")

    # then the branch holds one commit on the base, the same both times, and its tests pass
    assert first["commit"] == again["commit"]
    bare = remote_path(remotes, DEMO_REPO)
    assert git("rev-parse", "refs/heads/patch/issue-42", cwd=bare).strip() == first["commit"]
    assert git("rev-list", "--count", f"{proposed['base']}..patch/issue-42", cwd=bare) == "1\n"
    checkout = tmp_path / "checkout"
    git("clone", "--quiet", "--branch", "patch/issue-42", str(bare), str(checkout), cwd=tmp_path)
    tests = subprocess.run(["python", "-m", "unittest"], cwd=checkout, capture_output=True)
    assert tests.returncode == 0, tests.stderr
    # and the pull request goes into the remote's default branch
    assert opened == [(DEMO_REPO, "patch/issue-42", "main")] * 2


@pytest.mark.parametrize(
    "path",
    ["../outside.py", "/etc/passwd", ".git/config", "shop/../../x", "-rf", "shop\\cart.py", ""],
)
def test_paths_outside_the_repository_are_refused(remotes: Path, tmp_path: Path, path: str):
    with pytest.raises(PermanentError):
        call(patch.read_file, {"path": path}, tmp_path)
    with pytest.raises(PermanentError):
        call(patch.propose_fix, {"edits": [{"path": path, "old": "", "new": "x"}]}, tmp_path)
    assert not (tmp_path / "outside.py").exists()


def test_a_symbolic_link_in_the_repository_is_not_a_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a repository with a link to a directory outside it
    root = tmp_path / "remotes"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("keep\n")
    bare = create_repository(root, "acme/linked", {"README.md": "hi\n"})
    work = tmp_path / "work"
    git("clone", "--quiet", str(bare), str(work), cwd=tmp_path)
    os.symlink(outside, work / "escape")
    git("add", "escape", cwd=work)
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "link", cwd=work)
    git("push", "--quiet", "origin", "main", cwd=work)
    monkeypatch.setenv(patch.GIT_URL, url_template(root))
    linked = {**BUG, "repo": "acme/linked"}

    # when the model edits a file behind the link, then it is refused and nothing changes
    edit = {"path": "escape/secret.txt", "old": "keep", "new": "gone"}
    with pytest.raises(PermanentError, match="symbolic link"):
        call(patch.propose_fix, {"edits": [edit]}, tmp_path, run_input=linked)
    assert (outside / "secret.txt").read_text() == "keep\n"


def test_the_pull_request_is_only_for_the_runs_own_repository_and_branch(
    remotes: Path, tmp_path: Path
) -> None:
    proposed = call(patch.propose_fix, {"edits": [FIX]}, tmp_path)
    base = {"title": "t", "body": "b", "base": proposed["base"], "patch": proposed["patch"]}
    for repo, branch in [(DEMO_REPO, "patch/issue-7"), ("acme/other", "patch/issue-42")]:
        with pytest.raises(PermanentError, match="only for patch/issue-42 of acme/shop"):
            call(patch.open_fix_pull_request, {**base, "repo": repo, "branch": branch}, tmp_path)
    assert not has_branch(remotes, DEMO_REPO, "patch/issue-7")


def test_a_patch_that_reaches_outside_the_worktree_is_refused(
    remotes: Path, tmp_path: Path
) -> None:
    proposed = call(patch.propose_fix, {"edits": [FIX]}, tmp_path)
    evil = (
        proposed["patch"]
        .replace("a/shop/cart.py", "a/../evil.py")
        .replace("b/shop/cart.py", "b/../evil.py")
    )
    args = {
        "repo": DEMO_REPO, "branch": "patch/issue-42", "title": "t", "body": "b",
        "base": proposed["base"], "patch": evil,
    }  # fmt: skip
    with pytest.raises(PermanentError, match="not a relative path inside the repository"):
        call(patch.open_fix_pull_request, args, tmp_path)
    assert not has_branch(remotes, DEMO_REPO, "patch/issue-42")


def test_the_tests_run_with_the_configured_command_and_a_bare_environment(
    remotes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a test command that prints its environment, and a secret in the worker's
    monkeypatch.setenv(patch.TEST_COMMAND, "python -c 'import os; print(sorted(os.environ))'")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-not-for-tests")
    ran = call(patch.run_tests, {}, tmp_path)
    assert ran["passed"] is True
    assert "ANTHROPIC_API_KEY" not in ran["output"] and "NIGHTSHIFT" not in ran["output"]


def test_an_edit_that_does_not_match_once_goes_back_to_the_model(
    remotes: Path, tmp_path: Path
) -> None:
    missing = {"path": DEMO_FILE, "old": "total = price + quantity", "new": "x"}
    with pytest.raises(PermanentError, match="occurs 0 times"):
        call(patch.propose_fix, {"edits": [missing]}, tmp_path)


def test_a_worker_killed_mid_git_leaves_nothing_that_stops_the_next_one(
    remotes: Path, tmp_path: Path
) -> None:
    # given a proposal made, then what a SIGKILL mid-command leaves: git's lock files, and a
    # worktree half made
    call(patch.propose_fix, {"edits": [FIX]}, tmp_path)
    root = tmp_path / "data" / "patch" / "acme__shop"
    (root / "repo.git" / "worktrees" / "patch__issue-42" / "index.lock").write_text("")
    (root / "repo.git" / "packed-refs.lock").write_text("")

    # when the next call comes, then it works
    assert call(patch.propose_fix, {"edits": [FIX]}, tmp_path)["tests"]["passed"] is True
    (root / "worktrees" / "patch__issue-42" / ".git").unlink()
    assert call(patch.propose_fix, {"edits": [FIX]}, tmp_path)["tests"]["passed"] is True


def test_the_copies_and_worktrees_are_the_workers_user_s_alone(
    remotes: Path, tmp_path: Path
) -> None:
    # given a worker whose other files are readable by all (umask 022)
    old_umask = os.umask(0o022)
    try:
        # when Patch fetches the repository, checks out the worktree and proposes a
        # change that also adds a file in a new folder
        added = {"path": "docs/notes/rounding.md", "old": "", "new": "Totals are in cents.\n"}
        proposed = call(patch.propose_fix, {"edits": [FIX, added]}, tmp_path)
    finally:
        os.umask(old_umask)
    assert proposed["tests"]["passed"] is True

    # then no folder can be entered and no file read by another user of the machine
    workdir = tmp_path / "data" / "patch"
    tree = workdir / "acme__shop" / "worktrees" / "patch__issue-42"
    assert (tree / "docs" / "notes" / "rounding.md").is_file()
    kept = [workdir, *workdir.rglob("*")]
    assert len(kept) > 50
    shared = [f"{oct(p.lstat().st_mode & 0o777)} {p}" for p in kept if p.lstat().st_mode & 0o077]
    assert shared == []


def commit_files(work: Path, message: str, **files: str) -> None:
    for name, text in files.items():
        (work / name).write_text(text)
    git("add", *files, cwd=work)
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", message, cwd=work)
    git("push", "-q", "origin", "HEAD:main", cwd=work)


def test_a_damaged_local_copy_is_made_again_from_the_remote(tmp_path: Path) -> None:
    # given a worker's copy of a repository that lost the tree of the base it fetched (what a
    # crash left on a worker: from then on every fetch failed, the remote's next commit
    # arriving as a delta against the tree the copy no longer has)
    remotes = tmp_path / "remotes"
    remote = remote_path(remotes, "acme/tiny")
    remote.parent.mkdir(parents=True)
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    work = tmp_path / "work"
    git("clone", "-q", str(remote), str(work), cwd=tmp_path)
    commit_files(work, "one", a="a\n", b="b\n", c="c\n")
    config = gitwork.GitConfig(url_template(remotes), tmp_path / "patch", ("true",), 60.0)
    repository = gitwork.Repository(config, "acme/tiny")
    with repository.locked():
        base = repository.fetch()
    tree = git("rev-parse", f"{base}^{{tree}}", cwd=repository.copy).strip()
    (repository.copy / "objects" / tree[:2] / tree[2:]).unlink()
    commit_files(work, "two", d="d\n")

    # when it fetches again, then it makes the copy again and has the new base, whole
    with repository.locked():
        new_base = repository.fetch()
    assert new_base == git("rev-parse", "HEAD", cwd=work).strip() != base
    assert git("fsck", "--connectivity-only", "--no-dangling", cwd=repository.copy) == ""


GITHUB_EXISTS = "A pull request already exists for acme:b."
GITEA_EXISTS = "pull request already exists for these targets [id: 3, issue_id: 2, head_branch: b]"
NOT_FOUND_HEAD = {"resource": "PullRequest", "field": "head", "code": "invalid"}


@pytest.mark.parametrize(
    ("status", "answer", "exists"),
    [
        (422, {"message": "Validation Failed", "errors": [{"message": GITHUB_EXISTS}]}, True),
        (409, {"message": GITEA_EXISTS}, True),  # Gitea and Forgejo
        (422, {"message": "Validation Failed", "errors": [NOT_FOUND_HEAD]}, False),
        (409, {"message": "no commits between branches"}, False),
        (422, ["not", "an", "object"], False),
    ],
)
def test_a_hosts_answer_that_the_branch_has_a_pull_request_is_recognised(
    status: int, answer: Any, exists: bool
) -> None:
    assert services._already_exists(httpx.Response(status, json=answer)) is exists
