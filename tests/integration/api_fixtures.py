"""Helpers for the HTTP tests: the app with test secrets, signed requests, a live server, and
a run parked on a pending approval (as the engine leaves it)."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from models import Action, ActionAudit, ActionState, Run, RunStatus
from pipeline.agents.patch import REVIEWER
from pipeline.agents.price_synthesis import PRICING_APPROVER
from pipeline.api.base import ApiConfig
from pipeline.api.server import create_app, server_config
from pipeline.api.tokens import create_token
from pipeline.db import transaction
from pipeline.delivery.signatures import signed_headers
from pipeline.engine.action_rows import arguments_hash
from pipeline.runs.decisions import Actor
from pipeline.runs.start import create_run_txn

# The shipped approval-requiring tools' default approvers, deciding from a test.
REVIEWER_ACTOR = Actor(REVIEWER, "test")
PRICING_ACTOR = Actor(PRICING_APPROVER, "test")

TOKEN = "test-api-token-not-secret-0123456789"
APPROVAL_SECRET = "test-approval-secret-not-secret-0123"
EVENT_SECRET = "test-event-secret-not-secret-456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# The patch agent's approval-gated tool: opening a pull request needs a person's yes.
BUG = {"issue": 7, "repo": "acme/shop", "title": "totals are not rounded"}
PR_KEY = "patch:acme/shop:patch/issue-7"
PR_ARGS = {
    "repo": "acme/shop",
    "branch": "patch/issue-7",
    "title": "Fix #7: totals are not rounded",
    "body": "Fixes #7.",
}


def make_app(**overrides: Any) -> FastAPI:
    config = {
        "api_token": TOKEN,
        "approval_webhook_secret": APPROVAL_SECRET,
        "event_webhook_secret": EVENT_SECRET,
        **overrides,
    }
    return create_app(ApiConfig(**config))


def client(headers: dict[str, str] | None = None, **overrides: Any) -> TestClient:
    return TestClient(make_app(**overrides), headers=headers)


def signed(
    path: str,
    body: dict[str, Any] | bytes,
    secret: str | None = None,
    token: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """httpx keyword arguments for a webhook POST to `path`, signed for it (with the approval
    or the event secret, by the path), carrying `token` as the bearer if given."""
    if secret is None:
        secret = EVENT_SECRET if path.startswith("/events/") else APPROVAL_SECRET
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        **signed_headers(secret, "POST", path, raw, **extra),
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return {"content": raw, "headers": headers}


def person_token(identity: str = "alice@example.com") -> str:
    """A token for `identity`, as `nightshift tokens create --for` makes one."""
    return create_token(identity, created_by="test").token


def submit_login(
    api: TestClient | httpx.Client, fields: dict[str, str], **options: Any
) -> httpx.Response:
    """Post the sign-in form as the browser does: with the CSRF value the form carried."""
    form = api.get("/ui/login", follow_redirects=False)
    match = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert match, "the sign-in form carries a CSRF token"
    return api.post("/ui/login", data={**fields, "csrf": match.group(1)}, **options)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def start_as(base: str, token: str, agent: str, run_input: dict[str, Any]) -> uuid.UUID:
    """Start a run through a live API as whom `token` speaks for; the run's id."""
    answer = httpx.post(
        f"{base}/runs", json={"agent": agent, "input": run_input}, headers=bearer(token)
    )
    assert answer.status_code == 201, answer.text
    return uuid.UUID(answer.json()["run_id"])


def park_on_approval(
    key: str = PR_KEY, approvers: tuple[str, ...] = (), bug: dict[str, Any] | None = None
) -> uuid.UUID:
    """A patch run waiting on a pending approval, as the engine parks it."""
    with transaction() as session:
        run_id = create_run_txn(session, "patch", bug or BUG).run_id
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(status=RunStatus.WAITING, waiting_on=f"approval:{key}", step=1)
        )
        session.add(
            Action(
                idempotency_key=key,
                run_id=run_id,
                tool_use_id="toolu_s001_0",
                tool="open_fix_pull_request",
                service="githost",
                args=PR_ARGS,
                args_hash=arguments_hash(PR_ARGS),
                state=ActionState.PENDING_APPROVAL,
                requires_approval=True,
                approvers=list(approvers),
            )
        )
    return run_id


def action_row(key: str = PR_KEY) -> Action:
    with transaction() as session:
        return session.execute(select(Action).where(Action.idempotency_key == key)).scalar_one()


def as_seen(key: str = PR_KEY) -> dict[str, str]:
    """The run and `args_hash` of `key`'s action as an approver sees it (`GET /runs/{run_id}`
    lists them, the status page shows them): what an approval webhook's body must name."""
    action = action_row(key)
    return {"run_id": str(action.run_id), "args_hash": action.args_hash or ""}


def audit_trail(key: str = PR_KEY) -> list[ActionAudit]:
    with transaction() as session:
        query = select(ActionAudit).where(ActionAudit.action_key == key).order_by(ActionAudit.id)
        return list(session.scalars(query))


def count(model: type[Any]) -> int:
    with transaction() as session:
        return int(session.execute(select(func.count()).select_from(model)).scalar_one())


def api_answers(base: str) -> bool:
    """Whether an API at `base` answers its health check (one that is starting does not)."""
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def live_server(app: FastAPI) -> Iterator[str]:
    """Serve `app` with uvicorn on a free loopback port, in a thread; yields the base URL."""
    config = server_config(
        app,
        "127.0.0.1",
        0,
        log_level="warning",
        lifespan="off",
        ws="none",
        timeout_graceful_shutdown=5,  # a stream still open (SSE, ?wait=) is closed, not left
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="api-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
