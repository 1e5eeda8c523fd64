"""Sending completion webhooks through the action protocol: the idempotency key was saved with
the transition (models/notification.py); each attempt claims the row (a fence and a lease, as a
step claims a run), records `attempted` before the POST, and records the reply after it.

A sender that dies between the two leaves `attempted` with a lapsing claim: the next one finds
the outcome unknown and sends again with the same key and the same bytes, which a receiver
honouring Idempotency-Key turns into a replay (at most once per key). A temporary failure
(a timeout, a 5xx, a 429) is tried again later with backoff, from the tick; a refusal (another
4xx) or too many attempts fails the notification, with the reason on the row.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from models import ActionState, Batch, Run, RunEvent, RunStatus
from pipeline.crash import crash_point
from pipeline.db import transaction
from pipeline.engine.signatures import signed_headers
from pipeline.errors import redact_url, redact_urls
from pipeline.logs import get_logger
from pipeline.retry import is_temporary_status
from pipeline.settings import Settings, get_settings

log = get_logger("nightshift.notify")

SEND_SECONDS = 10.0
SEND_TIMEOUT = httpx.Timeout(SEND_SECONDS, connect=5.0)
MAX_ATTEMPTS = 12
FIRST_RETRY = timedelta(seconds=1)
LAST_RETRY = timedelta(minutes=15)
"""Backoff doubles from FIRST_RETRY up to LAST_RETRY (with jitter): twelve attempts end within
about three hours, well inside the 24 hours a receiver is asked to keep keys."""
EVENT_HEADER = "X-Nightshift-Event"


class Delivery(StrEnum):
    SKIPPED = "skipped"
    """Delivered already, held by another sender, or not due yet."""
    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"


_CLAIM = text(
    """
    UPDATE notifications
       SET fence = fence + 1,
           lease_expires_at = now() + make_interval(secs => :lease),
           dispatched_at = NULL,
           -- an attempt whose sender died before saving the reply: it may have arrived
           state = CASE WHEN state = 'attempted' THEN 'outcome_unknown' ELSE state END,
           updated_at = now()
     WHERE id = :id
       AND state IN ('intended', 'attempted', 'outcome_unknown')
       AND next_attempt_at <= now()
       AND (lease_expires_at IS NULL OR lease_expires_at < now())
    RETURNING id, fence, state, idempotency_key, event, url, body, attempts, run_id,
              batch_id, event_id
    """
)
_ATTEMPTED = text(
    """
    UPDATE notifications
       SET state = 'attempted', attempts = attempts + 1, body = :body,
           first_attempt_at = coalesce(first_attempt_at, now()), last_attempt_at = now(),
           updated_at = now()
     WHERE id = :id AND fence = :fence
    """
)
_RECORD = text(
    """
    UPDATE notifications
       SET state = :state, response_status = :status, error = :error,
           next_attempt_at = now() + make_interval(secs => :retry_in),
           lease_expires_at = NULL, updated_at = now()
     WHERE id = :id AND fence = :fence
    """
)


def deliver(notification_id: int, settings: Settings | None = None) -> Delivery:
    """One attempt at one notification, if it is owed, due and nobody else holds it."""
    settings = settings or get_settings()
    lease = SEND_SECONDS + settings.lease_seconds  # longer than any one send
    with transaction() as session:
        claim = session.execute(_CLAIM, {"id": notification_id, "lease": lease}).one_or_none()
        if claim is None:
            return Delivery.SKIPPED
        body = claim.body or _body(session, claim)
    if settings.notify_secret is None:
        return _record(claim, ActionState.FAILED, error="NIGHTSHIFT_NOTIFY_SECRET is not set")
    with transaction() as session:
        if not session.execute(
            _ATTEMPTED, {"id": notification_id, "fence": claim.fence, "body": body}
        ).rowcount:  # type: ignore[attr-defined]
            return Delivery.SKIPPED  # another sender took it over meanwhile
    try:
        response = httpx.post(
            claim.url,
            content=body.encode(),
            headers=_headers(claim, body, settings.notify_secret),
            timeout=SEND_TIMEOUT,
        )
    except httpx.HTTPError as exc:
        # Refused before anything was sent: nothing arrived. Anything else: it may have.
        state = ActionState.INTENDED if isinstance(exc, httpx.ConnectError) else None
        return _retry_later(claim, f"{type(exc).__name__}: {redact_urls(str(exc))}", None, state)
    crash_point("after_notify_sent")
    if response.is_success:
        log.info("notification %s delivered (HTTP %d)", claim.idempotency_key, response.status_code)
        return _record(claim, ActionState.CONFIRMED, status=response.status_code)
    error = f"HTTP {response.status_code}: {response.text[:200]}"
    if is_temporary_status(response.status_code):
        return _retry_later(claim, error, response.status_code, None)
    return _record(claim, ActionState.FAILED, status=response.status_code, error=error)


def _headers(claim: Any, body: str, secret: str) -> dict[str, str]:
    path = urlsplit(claim.url).path or "/"
    return {
        "Content-Type": "application/json",
        "Idempotency-Key": claim.idempotency_key,
        EVENT_HEADER: claim.event,
        **signed_headers(secret, "POST", path, body.encode()),
    }


def _retry_later(claim: Any, error: str, status: int | None, state: ActionState | None) -> Delivery:
    attempts = claim.attempts + 1
    if attempts >= MAX_ATTEMPTS:
        error = f"gave up after {attempts} attempts; the last: {error}"
        return _record(claim, ActionState.FAILED, status=status, error=error)
    ceiling = min(LAST_RETRY, FIRST_RETRY * 2 ** (attempts - 1)).total_seconds()
    retry_in = random.uniform(ceiling / 2, ceiling)
    log.warning(
        "notification %s to %s failed (%s); trying again in %.0f s",
        claim.idempotency_key, redact_url(claim.url), error, retry_in,
    )  # fmt: skip
    _record(claim, state or ActionState.OUTCOME_UNKNOWN, status=status, error=error,
            retry_in=retry_in)  # fmt: skip
    return Delivery.RETRY


def _record(
    claim: Any,
    state: ActionState,
    *,
    status: int | None = None,
    error: str | None = None,
    retry_in: float = 0.0,
) -> Delivery:
    params = {"id": claim.id, "fence": claim.fence, "state": state.value, "status": status,
              "error": error, "retry_in": retry_in}  # fmt: skip
    with transaction() as session:
        session.execute(_RECORD, params)
    if state is ActionState.FAILED:
        log.warning("notification %s failed: %s", claim.idempotency_key, error)
        return Delivery.FAILED
    return Delivery.DELIVERED if state is ActionState.CONFIRMED else Delivery.RETRY


def _body(session: Session, claim: Any) -> str:
    """The event as JSON, from the transition's run_events row: what was true then."""
    event = session.get(RunEvent, claim.event_id)
    assert event is not None, f"notification {claim.idempotency_key}: its event is gone"
    document: dict[str, Any] = {
        "id": claim.idempotency_key,
        "event": claim.event,
        "occurred_at": event.created_at.isoformat(),
    }
    if claim.run_id is not None:
        document["run"] = _run_part(session, claim.run_id, event.data)
    if claim.batch_id is not None:
        batch = session.get(Batch, claim.batch_id)
        assert batch is not None
        own = event.kind == "batch"
        document["batch"] = {
            "id": batch.id,
            "name": batch.name,
            "status": event.data["status"] if own else batch.status.value,
            "stop_reason": event.data.get("stop_reason") if own else batch.stop_reason,
        }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)


def _run_part(session: Session, run_id: Any, data: dict[str, Any]) -> dict[str, Any]:
    run = session.execute(select(Run.agent, Run.batch_id, Run.result).where(Run.id == run_id)).one()
    finished = RunStatus(data["status"]).is_terminal()
    return {
        "id": str(run_id),
        "agent": run.agent,
        "batch_id": run.batch_id,
        "status": data["status"],
        "stop_reason": data.get("stop_reason"),
        "waiting_on": data.get("waiting_on"),
        "error": data.get("error"),
        "result": run.result if finished else None,
    }
