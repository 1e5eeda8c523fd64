"""A git host speaking the pull-request part of GitHub's REST API (which Gitea and Forgejo also
serve), with its rule of one open pull request per head branch; with `git_root`, its
repositories are bare git repositories there, and a pull request needs its branch pushed first
(as on a real host). With `token`, every call must carry it (`Authorization: Bearer <token>`,
or Gitea's `token <token>`)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from pipeline.sandbox.base import SandboxServer, string_fields
from pipeline.sandbox.git_repos import has_branch
from pipeline.sandbox.transport import Rejected, Request, Response

PULL_STATES = ("open", "closed")
DOCS = "https://docs.github.com/rest/pulls/pulls"


class GitHostSandbox(SandboxServer):
    """`POST /repos/<owner>/<repo>/pulls {"title","head","base","body"}` (422 "A pull request
    already exists for owner:branch." when the head branch has an open one),
    `GET .../pulls?head=owner:branch&state=open|closed|all` (newest first), `GET .../pulls/<n>`,
    `PATCH .../pulls/<n> {"state"}`. Errors are GitHub's `{"message", "errors"?}`.
    """

    service = "githost"

    def __init__(
        self,
        *,
        log_path: str | os.PathLike[str] | None = None,
        git_root: Path | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(log_path=log_path)
        self.git_root = git_root
        """Where the bare repositories are (`<owner>/<name>.git`); None: no git behind it."""
        self._token = token
        self._pulls: dict[str, list[dict[str, Any]]] = {}
        """Pull requests per "owner/repo", in number order (number = index + 1)."""
        self._lock = threading.Lock()
        self.route("POST", "/repos/{owner}/{repo}/pulls", self._create)
        self.route("GET", "/repos/{owner}/{repo}/pulls", self._list)
        self.route("GET", "/repos/{owner}/{repo}/pulls/{number}", self._get)
        self.route("PATCH", "/repos/{owner}/{repo}/pulls/{number}", self._update)

    def pulls(self, repo: str, *, branch: str | None = None, state: str = "all") -> list[dict]:
        """The pull requests of `repo` (of head `branch`, in `state`), oldest first."""
        with self._lock:
            return [
                dict(p)
                for p in self._pulls.get(repo, [])
                if (branch is None or p["head"]["ref"] == branch) and state in ("all", p["state"])
            ]

    def error_body(self, status: int, message: str, extra: dict[str, Any]) -> Any:
        return {"message": message, **extra, "documentation_url": DOCS}

    def _create(self, request: Request) -> Response:
        self._authorize(request)
        repo = _repo(request)
        body = request.json_object()
        title, head, base = string_fields(body, "title", "head", "base")
        branch = head.split(":", 1)[-1]  # "owner:branch" or "branch"
        text = body.get("body") or ""
        if self.git_root is not None:
            for field, ref in (("head", branch), ("base", base)):
                if not has_branch(self.git_root, repo, ref):
                    raise Rejected(422, "Validation Failed", errors=[
                        {"resource": "PullRequest", "field": field, "code": "invalid"}
                    ])  # fmt: skip
        with self._lock:
            pulls = self._pulls.setdefault(repo, [])
            self._refuse_second_open(repo, pulls, branch)
            number = len(pulls) + 1
            owner = request.params["owner"]
            pull = {
                "number": number,
                "state": "open",
                "title": title,
                "body": text,
                "url": f"{self.url}/repos/{repo}/pulls/{number}",
                "html_url": f"{self.url}/{repo}/pull/{number}",
                "head": {"ref": branch, "label": f"{owner}:{branch}", "repo": {"full_name": repo}},
                "base": {"ref": base, "label": f"{owner}:{base}", "repo": {"full_name": repo}},
            }
            entry = self._record("opened", repo, pull)
            pull["created_at"] = entry["at"]
            pulls.append(pull)
            return Response(201, dict(pull))

    def _list(self, request: Request) -> Response:
        self._authorize(request)
        state = request.query.get("state", "open")
        if state not in (*PULL_STATES, "all"):
            raise Rejected(422, "'state' must be open, closed or all")
        head = request.query.get("head")
        pulls = self.pulls(_repo(request), state=state)
        if head is not None:  # GitHub's form, owner:branch
            pulls = [p for p in pulls if p["head"]["label"] == head]
        return Response(200, pulls[::-1])

    def _get(self, request: Request) -> Response:
        self._authorize(request)
        with self._lock:
            return Response(200, dict(self._find(request)))

    def _update(self, request: Request) -> Response:
        self._authorize(request)
        state = request.json_object().get("state")
        if state not in PULL_STATES:
            raise Rejected(422, "'state' must be open or closed")
        repo = _repo(request)
        with self._lock:
            pull = self._find(request)
            if state != pull["state"]:
                if state == "open":
                    self._refuse_second_open(repo, self._pulls[repo], pull["head"]["ref"])
                pull["state"] = state
                self._record("reopened" if state == "open" else "closed", repo, pull)
            return Response(200, dict(pull))

    def _authorize(self, request: Request) -> None:
        if self._token is None:
            return
        given = request.header("authorization") or ""
        if given not in (f"Bearer {self._token}", f"token {self._token}"):
            raise Rejected(401, "Bad credentials")

    def _record(self, action: str, repo: str, pull: dict[str, Any]) -> dict[str, Any]:
        return self.record(
            action=action,
            repo=repo,
            number=pull["number"],
            branch=pull["head"]["ref"],
            title=pull["title"],
            url=pull["html_url"],
        )

    def _find(self, request: Request) -> dict[str, Any]:
        pulls = self._pulls.get(_repo(request), [])
        number = request.params["number"]
        if not number.isdigit() or not 1 <= int(number) <= len(pulls):
            raise Rejected(404, "Not Found")
        return pulls[int(number) - 1]

    @staticmethod
    def _refuse_second_open(repo: str, pulls: list[dict[str, Any]], branch: str) -> None:
        if any(p["head"]["ref"] == branch and p["state"] == "open" for p in pulls):
            owner = repo.split("/", 1)[0]
            message = f"A pull request already exists for {owner}:{branch}."
            raise Rejected(422, "Validation Failed", errors=[
                {"resource": "PullRequest", "code": "custom", "message": message}
            ])  # fmt: skip


def _repo(request: Request) -> str:
    return f"{request.params['owner']}/{request.params['repo']}"
