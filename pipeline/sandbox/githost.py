"""A git host that allows one open pull request per branch, to test PRs that are opened once;
with `git_root`, its repositories are bare git repositories there, and a pull request needs
its branch pushed first (as on a real host)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from pipeline.sandbox.base import SandboxServer, string_fields
from pipeline.sandbox.git_repos import has_branch
from pipeline.sandbox.transport import Rejected, Request, Response

PULL_STATES = ("open", "closed")


class GitHostSandbox(SandboxServer):
    """`POST /repos/<owner>/<repo>/pulls {"branch","title","body"}` (409 when the branch already
    has an open PR), `GET .../pulls?branch=B&state=open|closed|all`, `GET .../pulls/<n>`,
    `PATCH .../pulls/<n> {"state"}`.
    """

    service = "githost"

    def __init__(
        self, *, log_path: str | os.PathLike[str] | None = None, git_root: Path | None = None
    ) -> None:
        super().__init__(log_path=log_path)
        self.git_root = git_root
        """Where the bare repositories are (`<owner>/<name>.git`); None: no git behind it."""
        self._pulls: dict[str, list[dict[str, Any]]] = {}
        """Pull requests per "owner/repo", in number order (number = index + 1)."""
        self._lock = threading.Lock()
        self.route("POST", "/repos/{owner}/{repo}/pulls", self._create)
        self.route("GET", "/repos/{owner}/{repo}/pulls", self._list)
        self.route("GET", "/repos/{owner}/{repo}/pulls/{number}", self._get)
        self.route("PATCH", "/repos/{owner}/{repo}/pulls/{number}", self._update)

    def pulls(self, repo: str, *, branch: str | None = None, state: str = "all") -> list[dict]:
        with self._lock:
            return [
                dict(p)
                for p in self._pulls.get(repo, [])
                if (branch is None or p["branch"] == branch) and state in ("all", p["state"])
            ]

    def _create(self, request: Request) -> Response:
        repo = _repo(request)
        body = request.json_object()
        branch, title = string_fields(body, "branch", "title")
        text = body.get("body") or ""
        if self.git_root is not None and not has_branch(self.git_root, repo, branch):
            raise Rejected(422, f"branch {branch} does not exist in {repo}: push it first")
        with self._lock:
            pulls = self._pulls.setdefault(repo, [])
            self._refuse_second_open(pulls, branch)
            number = len(pulls) + 1
            pull = {
                "number": number,
                "repo": repo,
                "branch": branch,
                "title": title,
                "body": text,
                "state": "open",
                "url": f"{self.url}/repos/{repo}/pulls/{number}",
            }
            entry = self._record("opened", pull)
            pull["created_at"] = entry["at"]
            pulls.append(pull)
            return Response(201, dict(pull))

    def _list(self, request: Request) -> Response:
        state = request.query.get("state", "open")
        if state not in (*PULL_STATES, "all"):
            raise Rejected(400, "'state' must be open, closed or all")
        return Response(
            200, self.pulls(_repo(request), branch=request.query.get("branch"), state=state)
        )

    def _get(self, request: Request) -> Response:
        with self._lock:
            return Response(200, dict(self._find(request)))

    def _update(self, request: Request) -> Response:
        state = request.json_object().get("state")
        if state not in PULL_STATES:
            raise Rejected(400, "'state' must be open or closed")
        with self._lock:
            pull = self._find(request)
            if state != pull["state"]:
                if state == "open":
                    self._refuse_second_open(self._pulls[pull["repo"]], pull["branch"])
                pull["state"] = state
                self._record("reopened" if state == "open" else "closed", pull)
            return Response(200, dict(pull))

    def _record(self, action: str, pull: dict[str, Any]) -> dict[str, Any]:
        fields = ("repo", "number", "branch", "title", "url")
        return self.record(action=action, **{k: pull[k] for k in fields})

    def _find(self, request: Request) -> dict[str, Any]:
        pulls = self._pulls.get(_repo(request), [])
        number = request.params["number"]
        if not number.isdigit() or not 1 <= int(number) <= len(pulls):
            raise Rejected(404, f"no pull request #{number}")
        return pulls[int(number) - 1]

    @staticmethod
    def _refuse_second_open(pulls: list[dict[str, Any]], branch: str) -> None:
        existing = next((p for p in pulls if p["branch"] == branch and p["state"] == "open"), None)
        if existing is not None:
            raise Rejected(
                409,
                f"a pull request for branch {branch} is already open",
                pull=dict(existing),
            )


def _repo(request: Request) -> str:
    return f"{request.params['owner']}/{request.params['repo']}"
