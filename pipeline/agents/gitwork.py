"""Patch's repository work: a local copy of the remote, one worktree and branch per issue,
reading files at a base commit, applying a change, running the repository's tests, and
committing and pushing a change.

Nothing the model writes reaches a shell or widens what a command does: every command is an
argument list; paths are checked to stay inside the worktree (no `..`, no `.git`, no symlink
on the way); refs are checked (a 40-hex base, the issue's own branch); the test command comes
from configuration only; tests run with a bare environment (no keys, no nightshift settings)
and a time limit. Everything it keeps is its user's alone (0700 folders, 0600 files): a
repository's code may be private, and a worktree holds the model's change before anyone
approved it. The commit of a change is deterministic (fixed author, the base commit's
date), so pushing it again after a crash pushes the same commit: a no-op, never a force-push.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pipeline.errors import PermanentError, TemporaryError
from pipeline.logs import get_logger
from pipeline.settings import child_environment

log = get_logger("nightshift.patch")

REPO_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*/[A-Za-z0-9_][A-Za-z0-9_.-]*$")
SHA = re.compile(r"^[0-9a-f]{40}$")
BRANCH = re.compile(r"^patch/issue-[0-9]{1,9}$")
MAX_FILE_BYTES = 64 * 1024
MAX_PATCH_BYTES = 128 * 1024
MAX_OUTPUT_CHARS = 4000
AUTHOR = ("nightshift Patch", "patch@nightshift.invalid")
GIT_TIMEOUT = 60.0
PRIVATE = 0o077
"""The umask of everything run here: what git and the tests write is this user's alone."""


@dataclass(frozen=True)
class TestRun:
    passed: bool
    exit_code: int | None
    """None when the tests ran out of time."""
    output: str
    """The last MAX_OUTPUT_CHARS characters of stdout and stderr."""

    def as_dict(self) -> dict[str, object]:
        return {"passed": self.passed, "exit_code": self.exit_code, "output": self.output}


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    """Text that occurs exactly once in the file; empty to create a file that does not exist."""
    new: str


@dataclass(frozen=True)
class GitConfig:
    url_template: str
    """The remote of a repository, `{repo}` standing for `owner/name`."""
    workdir: Path
    test_command: tuple[str, ...]
    test_timeout: float


def check_repo(repo: str) -> str:
    parts = repo.split("/")
    if not REPO_NAME.match(repo) or any(part in (".", "..") for part in parts):
        raise PermanentError(f"{repo!r} is not a repository name like owner/name")
    return repo


def check_path(path: str) -> str:
    """A relative path inside the repository, in git's form; anything else is refused."""
    pure = PurePosixPath(path)
    if (
        not path
        or "\\" in path
        or "\x00" in path
        or pure.is_absolute()
        or any(part in ("", ".", "..") for part in path.split("/"))
        or pure.parts[0] == ".git"
        or path.startswith("-")
    ):
        raise PermanentError(f"{path!r} is not a relative path inside the repository")
    return str(pure)


class Repository:
    """One remote repository as this worker keeps it: a local copy and issue worktrees."""

    def __init__(self, config: GitConfig, repo: str) -> None:
        self.config = config
        self.repo = check_repo(repo)
        self.url = config.url_template.replace("{repo}", repo)
        self.root = config.workdir / repo.replace("/", "__")
        self.copy = self.root / "repo.git"
        self.default_branch = "main"
        """The remote's default branch (what a pull request merges into), as fetch found it."""

    # -- the local copy --------------------------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[None]:
        """One git operation at a time on this repository, across this host's workers. A
        worker killed in the middle of one leaves git's own lock files: holding this lock, no
        git process of ours works here, so any left is stale and goes."""
        _private(self.config.workdir)
        _private(self.root)
        with open(self.root / "lock", "w", opener=_private_file) as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                for stale in self.copy.rglob("*.lock") if self.copy.exists() else ():
                    stale.unlink(missing_ok=True)
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def fetch(self) -> str:
        """Bring the local copy up to date; the remote default branch's commit (the base). A
        copy that is damaged (a ref naming an object it lacks: git fetch then fails with 'did
        not send all necessary objects' for ever) is made again from the remote, once; a fetch
        that fails with the copy whole is the remote's or the network's failure, raised."""
        try:
            return self._fetch()
        except TemporaryError as failed:
            damage = self._damage()
            if damage is None:
                raise
            log.warning("local copy of %s is damaged (%s); making it again: %s",
                        self.repo, damage, failed)  # fmt: skip
            shutil.rmtree(self.copy)
            return self._fetch()

    def _damage(self) -> str | None:
        """What git fsck finds missing in the local copy (None: nothing, or no copy yet)."""
        if not (self.copy / "HEAD").exists():
            return None
        argv = ["git", "fsck", "--connectivity-only", "--no-dangling", "--no-progress"]
        checked = self._run(argv, self.copy, check=False)
        return None if checked.returncode == 0 else _last_line(checked.stderr or checked.stdout)

    def _fetch(self) -> str:
        if not (self.copy / "HEAD").exists():
            self._git("init", "--quiet", "--bare", str(self.copy), cwd=self.root)
        configured = self._run(["git", "config", "remote.origin.url"], self.copy, check=False)
        if configured.returncode != 0:
            self._git("remote", "add", "origin", self.url)
        elif configured.stdout.strip() != self.url:
            self._git("remote", "set-url", "origin", self.url)
        self._git("fetch", "--quiet", "--prune", "origin", "+refs/heads/*:refs/remotes/origin/*")
        head = self._git("ls-remote", "--symref", "origin", "HEAD")
        match = re.search(r"^ref: refs/heads/(\S+)\s+HEAD", head, re.MULTILINE)
        self.default_branch = match.group(1) if match else "main"
        ref = f"refs/remotes/origin/{self.default_branch}^{{commit}}"
        return self._git("rev-parse", "--verify", ref)

    def read(self, base: str, path: str) -> str:
        check_sha(base)
        path = check_path(path)
        kind = self._run(["git", "cat-file", "-t", f"{base}:{path}"], self.copy, check=False)
        if kind.returncode != 0 or kind.stdout.strip() != "blob":
            raise PermanentError(f"there is no file {path} at {base[:12]}")
        size = int(self._git("cat-file", "-s", f"{base}:{path}"))
        if size > MAX_FILE_BYTES:
            raise PermanentError(f"{path} is {size} bytes; files up to {MAX_FILE_BYTES} are read")
        return self._git("cat-file", "blob", f"{base}:{path}", strip=False)

    def files(self, base: str) -> list[str]:
        check_sha(base)
        return self._git("ls-tree", "-r", "--name-only", base).splitlines()

    # -- an issue's worktree ---------------------------------------------------------------

    def worktree(self, branch: str, base: str) -> Path:
        """The issue's worktree, on its own branch, reset to exactly `base`."""
        check_sha(base)
        if not BRANCH.match(branch):
            raise PermanentError(f"{branch!r} is not an issue branch like patch/issue-42")
        path = self.root / "worktrees" / branch.replace("/", "__")
        if not (path / ".git").is_file() or not self._reset(path, branch, base):
            # None yet, or one a killed worker left half made: make it again.
            shutil.rmtree(path, ignore_errors=True)
            self._git("worktree", "prune")
            self._git("worktree", "add", "--quiet", "--force", "-B", branch, str(path), base)
        self._git("clean", "--quiet", "-d", "--force", "-x", cwd=path)
        return path

    def _reset(self, path: Path, branch: str, base: str) -> bool:
        argv = ["git", "checkout", "--quiet", "--force", "-B", branch, base]
        return self._run(argv, path, check=False).returncode == 0

    def apply_edits(self, tree: Path, edits: list[Edit]) -> str:
        """Apply the edits in the worktree; the change as a unified diff against the base."""
        for number, edit in enumerate(edits, 1):
            target = confined(tree, edit.path)
            exists = target.is_file()
            if not edit.old:
                if exists or target.exists():
                    raise PermanentError(f"edit {number}: {edit.path} exists; name text to replace")
                _private_dirs(tree, target.parent)
                target.touch(mode=0o600)
                target.write_text(edit.new, encoding="utf-8")
                continue
            if not exists:
                raise PermanentError(f"edit {number}: there is no file {edit.path}")
            text = target.read_text(encoding="utf-8")
            found = text.count(edit.old)
            if found != 1:
                raise PermanentError(
                    f"edit {number}: the old text occurs {found} times in {edit.path}; "
                    "it must occur exactly once (include more of the lines around it)"
                )
            target.write_text(text.replace(edit.old, edit.new), encoding="utf-8")
        self._git("add", "--all", cwd=tree)
        patch = self._git("diff", "--cached", "--no-color", "--no-ext-diff", cwd=tree, strip=False)
        if not patch.strip():
            raise PermanentError("the edits change nothing")
        if len(patch.encode()) > MAX_PATCH_BYTES:
            raise PermanentError(f"the change is larger than {MAX_PATCH_BYTES} bytes")
        return patch

    def apply_patch(self, tree: Path, patch: str) -> None:
        """Apply a unified diff (as apply_edits made it) to the worktree's index and files."""
        if len(patch.encode()) > MAX_PATCH_BYTES:
            raise PermanentError(f"the patch is larger than {MAX_PATCH_BYTES} bytes")
        for path in patched_paths(patch):
            confined(tree, path)
        checked = self._run(
            ["git", "apply", "--check", "--index", "-"], tree, check=False, stdin=patch
        )
        if checked.returncode != 0:
            raise PermanentError(f"the patch does not apply: {_last_line(checked.stderr)}")
        self._run(["git", "apply", "--index", "-"], tree, stdin=patch)

    def run_tests(self, tree: Path) -> TestRun:
        """The configured test command in the worktree, with nothing of this process's
        environment but a PATH (the model's change runs here: no keys, no settings)."""
        path = os.pathsep.join(
            [str(Path(sys.executable).parent), child_environment().get("PATH", "")]
        )
        env = {"PATH": path, "HOME": str(tree), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run(
                list(self.config.test_command),
                cwd=tree,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.config.test_timeout,
                umask=PRIVATE,
            )
        except subprocess.TimeoutExpired as exc:
            output = _text(exc.stdout) + _text(exc.stderr)
            timed_out = f"\n(stopped after {self.config.test_timeout:g} s)"
            return TestRun(False, None, (output + timed_out)[-MAX_OUTPUT_CHARS:])
        except OSError as exc:
            raise PermanentError(f"the test command cannot start: {exc}") from None
        output = (done.stdout + done.stderr)[-MAX_OUTPUT_CHARS:]
        return TestRun(done.returncode == 0, done.returncode, output)

    def commit(self, tree: Path, base: str, message: str) -> str:
        """Commit the staged change; the same base, change and message give the same commit."""
        date = self._git("show", "--no-patch", "--format=%cI", base)
        name, email = AUTHOR
        env = {
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": email,
            "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_DATE": date,
        }
        argv = ["git", "-c", "core.hooksPath=/dev/null", "commit", "--quiet", "--no-verify"]
        self._run([*argv, "--file", "-"], tree, stdin=message, env=env)
        return self._git("rev-parse", "HEAD", cwd=tree)

    def push(self, commit: str, branch: str) -> None:
        """Push the commit to the remote branch; never forced. A branch already at this commit
        (pushed before a crash) is fine; one with other commits is refused."""
        check_sha(commit)
        remote = self._remote_branch(branch)
        if remote == commit:
            return
        if remote is not None:
            raise PermanentError(
                f"{branch} already has other commits on the remote ({remote[:12]}); "
                "nothing was pushed"
            )
        self._git("push", "--quiet", "origin", f"{commit}:refs/heads/{branch}")

    def _remote_branch(self, branch: str) -> str | None:
        line = self._git("ls-remote", "origin", f"refs/heads/{branch}")
        return line.split()[0] if line else None

    # -- running git -----------------------------------------------------------------------

    def _git(self, *args: str, cwd: Path | None = None, strip: bool = True) -> str:
        out = self._run(["git", *args], cwd or self.copy).stdout
        return out.strip() if strip else out

    def _run(
        self,
        argv: list[str],
        cwd: Path,
        *,
        check: bool = True,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        environment = child_environment(
            {
                "GIT_TERMINAL_PROMPT": "0",
                # Never a repository above the work directory (a data directory in a checkout).
                "GIT_CEILING_DIRECTORIES": str(self.config.workdir.resolve()),
                **(env or {}),
            }
        )
        try:
            done = subprocess.run(
                argv,
                cwd=cwd,
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                env=environment,
                timeout=GIT_TIMEOUT,
                umask=PRIVATE,
            )
        except subprocess.TimeoutExpired:
            raise TemporaryError(f"git {argv[1]} took longer than {GIT_TIMEOUT:g} s") from None
        if check and done.returncode != 0:
            # The remote's URL may carry a token: it never reaches an error, a log or the journal.
            why = _last_line(done.stderr.replace(self.url, "<remote>"))
            kind = TemporaryError if argv[1] in ("fetch", "push", "ls-remote") else PermanentError
            raise kind(f"git {argv[1]} failed for {self.repo}: {why}")
        return done


def _private(directory: Path) -> None:
    """A folder only this user may enter (also when an earlier release made it 0755)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)


def _private_dirs(tree: Path, directory: Path) -> None:
    """`directory` and the folders between it and the worktree, each made 0700 (mkdir's
    `parents` would make them with the process's umask)."""
    relative = directory.relative_to(tree)
    for folder in [*reversed(relative.parents), relative][1:]:
        (tree / folder).mkdir(mode=0o700, exist_ok=True)


def _private_file(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def check_sha(sha: str) -> str:
    if not SHA.match(sha):
        raise PermanentError(f"{sha!r} is not a full commit id (40 hex digits)")
    return sha


def confined(tree: Path, path: str) -> Path:
    """The file `path` names inside the worktree, refusing any way out (symlinks included)."""
    relative = check_path(path)
    target = tree / relative
    steps = [p for p in reversed(Path(relative).parents) if p != Path(".")]
    for step in [*steps, Path(relative)]:
        if (tree / step).is_symlink():
            raise PermanentError(f"{path!r} goes through a symbolic link; it is not changed")
    if not target.resolve().is_relative_to(tree.resolve()):
        raise PermanentError(f"{path!r} is outside the repository")
    return target


def patched_paths(patch: str) -> list[str]:
    """Every path a unified diff names (old and new sides)."""
    found = []
    for line in patch.splitlines():
        if line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t")[0]
            if name != "/dev/null":
                found.append(name[2:] if name[:2] in ("a/", "b/") else name)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            found.append(line.split(" ", 2)[2])
    return found


def test_command(raw: str) -> tuple[str, ...]:
    argv = tuple(shlex.split(raw))
    if not argv:
        raise PermanentError("the test command is empty")
    return argv


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")
