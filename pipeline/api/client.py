"""A small client for other services: start a run and wait for its outcome over the HTTP API.

    from pipeline.api.client import wait_for_run
    outcome = wait_for_run(run_id, timeout=300)   # NIGHTSHIFT_API_URL, NIGHTSHIFT_API_TOKEN
    if outcome.succeeded: ...

Waiting is a long-poll (`GET /runs/{id}?wait=`): the server answers the moment the run
finishes or starts waiting, holding no worker and no thread meanwhile, and the client asks
again until its own timeout. A run waiting on a timer is waited through; one waiting for a
person (an approval, an unknown outcome) is returned as it is, for the caller to decide.
A `start_run.delay(...)` caller gets the run id from `.get()` and waits here.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx

from models import RunStatus
from pipeline.errors import Failed, RunNotFound
from pipeline.settings import get_settings
from pipeline.views.outcomes import RunOutcome

LONG_POLL = 60.0
"""Seconds one request waits at most (the server accepts up to 120)."""
TIMER_NAP = 1.0
"""Between looks while the run waits on a timer that is due (the tick wakes it)."""


# The HTTP client's own error (only this client raises it), so it stays at this edge.
class ClientError(Failed):
    """The nightshift API refused the request or could not be reached."""


class NightshiftClient:
    def __init__(self, base_url: str | None = None, token: str | None = None) -> None:
        base_url = base_url or get_settings().api_url
        token = token or get_settings().api_token
        if not base_url:
            raise ClientError("the nightshift API's URL is not set (NIGHTSHIFT_API_URL)")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(LONG_POLL + 30, connect=10),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> NightshiftClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start_run(
        self,
        agent: str,
        run_input: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        deadline: float | str | None = None,
    ) -> str:
        """Start a run (once per idempotency key); its id."""
        body: dict[str, Any] = {"agent": agent, "input": run_input}
        if deadline is not None:
            body["deadline"] = deadline
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        started = self._call("POST", "/runs", json=body, headers=headers)
        return str(started["run_id"])

    def outcome(self, run_id: str | uuid.UUID, wait: float = 0) -> RunOutcome:
        """The run now, or (wait) once it finished or started waiting, at most `wait` s."""
        params = {"wait": f"{min(wait, LONG_POLL):g}"} if wait > 0 else {}
        shown = self._call("GET", f"/runs/{run_id}", params=params)
        return RunOutcome.from_json(shown["run"])

    def wait_for_run(self, run_id: str | uuid.UUID, timeout: float) -> RunOutcome:
        """The run once it finished or waits for a person, or as it is after `timeout` s."""
        give_up = time.monotonic() + timeout
        while True:
            left = give_up - time.monotonic()
            found = self.outcome(run_id, wait=max(left, 0))
            left = give_up - time.monotonic()
            if found.finished or found.needs_person or left <= 0:
                return found
            if found.status is not RunStatus.RUNNING:  # a timer: nothing happens before it is due
                due = _seconds_until(found.wake_at) if found.wake_at else 0.0
                time.sleep(min(max(due, TIMER_NAP), left))

    def _call(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, **options)
        except httpx.HTTPError as exc:
            raise ClientError(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        if response.status_code == 404:
            raise RunNotFound(_error(response))
        if response.is_error:
            raise ClientError(f"{method} {path}: HTTP {response.status_code}: {_error(response)}")
        answer: dict[str, Any] = response.json()
        return answer


def _error(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def _seconds_until(when: datetime) -> float:
    return (when - datetime.now(UTC)).total_seconds()


def wait_for_run(run_id: str | uuid.UUID, timeout: float) -> RunOutcome:
    """Wait for a run through the API named by NIGHTSHIFT_API_URL and NIGHTSHIFT_API_TOKEN."""
    with NightshiftClient() as client:
        return client.wait_for_run(run_id, timeout)
