"""The chaos harness's approvals go where a person's would: the HTTP API (`nightshift api`, a
process of its own), through the signed approval webhook, with an approver's token made by
`nightshift tokens create`. So a webhook fired twice meets the signature check and the replay
cache, not only the decision's compare-and-set."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

from pipeline.chaos.common import ChaosError, WebhookUnavailable
from pipeline.delivery.signatures import signed_headers
from pipeline.settings import child_environment

TIMEOUT = httpx.Timeout(30.0, connect=5.0)


@dataclass(frozen=True)
class Delivery:
    """What the webhook answered one delivery."""

    status: int
    first: bool = False
    """The decision took effect with this delivery (at most one per action, ever)."""
    state: str = ""
    run_id: str | None = None
    replay: bool = False
    """Refused as a replay of a delivery already received (401)."""


@dataclass
class ApiServer:
    """`nightshift api` on a free loopback port, with secrets of its own, logging to `log_path`."""

    log_path: Path
    env: dict[str, str]
    approval_secret: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    _log_file: IO[bytes] | None = field(default=None, repr=False)
    api_token: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    """NIGHTSHIFT_API_TOKEN: what a client of the whole API (and the status page) presents."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ApiServer:
        self.port = self.port or _free_port()
        env = {
            **child_environment(self.env),
            "NIGHTSHIFT_API_TOKEN": self.api_token,
            "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET": self.approval_secret,
            "NIGHTSHIFT_EVENT_WEBHOOK_SECRET": secrets.token_urlsafe(32),
            "PYTHONUNBUFFERED": "1",
        }
        argv = [sys.executable, "-m", "pipeline.cli", "api", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--log-level", "warning"]
        self._log_file = self.log_path.open("ab")
        self.process = subprocess.Popen(
            argv, env=env, stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 60
        while not self._answers():
            if self.exited() or time.monotonic() > deadline:
                raise ChaosError(f"the API did not start; see {self.log_path}")
            time.sleep(0.2)
        return self

    def _answers(self) -> bool:
        """Serving (healthy or not: a restart may find PostgreSQL away for a moment)."""
        try:
            httpx.get(f"{self.url}/healthz", timeout=2)
        except httpx.TransportError:
            return False
        return True

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()


def create_token(identity: str, env: dict[str, str]) -> str:
    """A person's token, made as an operator makes one: `nightshift tokens create --for`."""
    argv = [sys.executable, "-m", "pipeline.cli", "tokens", "create", "--for", identity]
    argv += ["--note", "the chaos harness's approvals", "--json"]
    done = subprocess.run(
        argv, env=child_environment(env), capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise ChaosError(f"nightshift tokens create failed: {done.stderr.strip()[-500:]}")
    token: str = json.loads(done.stdout)["token"]
    return token


@dataclass(frozen=True)
class ApprovalWebhook:
    """Signs and posts approvals to the API's `POST /approvals/{key}` as one approver."""

    url: str
    secret: str = field(repr=False)
    token: str = field(repr=False)

    def request(
        self, key: str, note: str, run_id: str, args_hash: str
    ) -> tuple[str, bytes, dict[str, str]]:
        """One delivery approving the action of `run_id` with these arguments, signed now:
        (url, body, headers). Sending it twice is a replay."""
        path = f"/approvals/{key}"
        decision = {"decision": "approve", "note": note, "run_id": run_id, "args_hash": args_hash}
        body = json.dumps(decision).encode()
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {self.token}",
            **signed_headers(self.secret, "POST", path, body),
        }
        return f"{self.url}{path}", body, headers

    def send(self, url: str, body: bytes, headers: dict[str, str]) -> Delivery:
        """Post one delivery; WebhookUnavailable when the API (or its database) is away, a
        ChaosError for any other refusal."""
        try:
            response = httpx.post(url, content=body, headers=headers, timeout=TIMEOUT)
        except httpx.TransportError as exc:
            raise WebhookUnavailable(f"the API did not answer: {type(exc).__name__}") from None
        if response.status_code >= 500:
            raise WebhookUnavailable(f"the API answered {response.status_code}")
        answer = _json(response)
        if response.status_code == 200:
            run_id = answer.get("run_id")
            return Delivery(200, answer.get("first") is True, str(answer.get("state", "")),
                            str(run_id) if run_id else None)  # fmt: skip
        why = str(answer.get("error", response.text))
        if response.status_code == 401 and "replay" in why:
            return Delivery(401, replay=True)
        raise ChaosError(f"the webhook answered {response.status_code}: {why[:200]}")


def _json(response: httpx.Response) -> dict[str, object]:
    try:
        found = response.json()
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
