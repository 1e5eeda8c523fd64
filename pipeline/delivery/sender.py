"""Sending webhooks through the action protocol: a webhook is an action (kind `webhook`,
models/action.py) whose idempotency key was saved with the transition it announces (or with its
alert); each attempt claims the row (webhooks.sql claim_webhook: a fence and a lease, as a step
claims a run), records `attempted` before the POST and `confirmed` with the reply after it,
through the statements a tool's action uses (actions.sql action_state, confirm_action).

A sender that dies between the two leaves `attempted` with a lapsing claim: the next one finds
the outcome unknown and sends again with the same key and the same bytes, which a receiver
honouring Idempotency-Key turns into a replay (at most once per key). A temporary failure
(a timeout, a 5xx, a 429) is tried again later with backoff, from the tick; a refusal (another
4xx) or too many attempts fails the webhook, with the reason on the row
(webhooks.sql webhook_not_delivered).
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

import pipeline.http_deadline as http_deadline
import pipeline.statements as statements
from models import ActionState, Alert, Batch, Run, RunEvent, RunStatus
from pipeline.crash import crash_point
from pipeline.db import transaction
from pipeline.delivery.receivers import MIN_DEFERRAL, RECEIVERS
from pipeline.delivery.signatures import signed_headers
from pipeline.errors import TargetRefused, TargetUnresolved, redact_url, redact_urls
from pipeline.logs import get_logger
from pipeline.retry import is_temporary_status
from pipeline.runs.outbound import ANYWHERE, Target, resolve_target
from pipeline.settings import Settings, get_settings

log = get_logger("nightshift.notify")

SEND_SECONDS = 5.0
"""Each POST's total deadline, connection to the answer's last byte: a receiver has seconds to
answer, however it answers, and one that does not is backed off
(pipeline/delivery/receivers.py) rather than waited for."""
MAX_ATTEMPTS = 12
FIRST_RETRY = timedelta(seconds=1)
LAST_RETRY = timedelta(minutes=15)
"""Backoff doubles from FIRST_RETRY up to LAST_RETRY (with jitter): twelve attempts end within
about three hours, well inside the 24 hours a receiver is asked to keep keys."""
EVENT_HEADER = "X-Nightshift-Event"


class Delivery(StrEnum):
    SKIPPED = "skipped"
    """Delivered already, held by another sender, not due yet, or put off for its receiver."""
    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"


def deliver(key: str, settings: Settings | None = None) -> Delivery:
    """One attempt at one webhook, if it is owed, due and nobody else holds it."""
    settings = settings or get_settings()
    lease = SEND_SECONDS + settings.lease_seconds  # longer than any one send
    with transaction() as session:
        claim = statements.first(session, "claim_webhook", key=key, lease=lease)
        if claim is None:
            return Delivery.SKIPPED
        body = claim.args.get("body") or _body(session, claim)
    alert = "alert_id" in claim.args
    if settings.notify_secret is None and not alert:  # an alert goes unsigned, as it always did
        return _record(claim, ActionState.FAILED, error="NIGHTSHIFT_NOTIFY_SECRET is not set")
    # An alert's URL is the operator's setting, not a caller's: the policy is for the latter.
    allowed = ANYWHERE if alert else settings.notify_allowed
    try:  # resolved again now: what the name meant at the start may not be what it means now
        target = resolve_target(claim.args["url"], allowed)
    except TargetRefused as exc:
        return _record(claim, ActionState.FAILED, error=str(exc))
    except TargetUnresolved as exc:
        return _retry_later(claim, str(exc), None, ActionState.INTENDED)
    wait = RECEIVERS.put_off(target.receiver)
    if wait > 0:  # not attempted: its receiver failed just now, and would hold a sender again
        error = f"not sent: {target.receiver} failed just before; trying again in {wait:.0f} s"
        _record(claim, ActionState(claim.state), error=error, retry_in=wait)
        return Delivery.SKIPPED
    attempted = ActionState.ATTEMPTED
    try:
        with transaction() as session:
            if not statements.execute(
                session, "action_state", key=key, run_id=claim.run_id, fence=claim.fence,
                state=attempted, sources=list(ActionState.sources_of(attempted)),
                attempted=True, args=statements.jsonb({**claim.args, "body": body}), error=None,
                resolution=None,
            ):  # fmt: skip
                return Delivery.SKIPPED  # another sender took it over meanwhile
        return _send(claim, target, body, settings.notify_secret)
    finally:
        RECEIVERS.sent(target.receiver)


def _send(claim: Any, target: Target, body: str, secret: str | None) -> Delivery:
    try:
        with http_deadline.client(SEND_SECONDS, follow_redirects=False) as client:
            response = client.request(
                "POST",
                target.pinned_url,  # the address checked, not a second lookup
                content=body.encode(),
                headers={**_headers(claim, body, secret), "Host": target.host_header},
                extensions={"sni_hostname": target.host},  # TLS checks the name, not the address
            )
    except httpx.HTTPError as exc:
        backoff = RECEIVERS.failed(target.receiver)
        # Refused before anything was sent: nothing arrived. Anything else: it may have.
        state = ActionState.INTENDED if isinstance(exc, httpx.ConnectError) else None
        error = f"{type(exc).__name__}: {redact_urls(str(exc))}"
        return _retry_later(claim, error, None, state, backoff)
    crash_point("after_notify_sent")
    error = f"HTTP {response.status_code}: {response.text[:200]}"
    if not response.is_success and is_temporary_status(response.status_code):
        backoff = RECEIVERS.failed(target.receiver)
        return _retry_later(claim, error, response.status_code, None, backoff)
    # The receiver answered. If this was a retry (or this process had backed the receiver
    # off), it was the receiver's probe: its other webhooks, put off past it, are due now.
    recovered = RECEIVERS.answered(target.receiver) or claim.attempts > 0
    others = "bring_back_receiver" if recovered else None
    if response.is_success:
        log.info("webhook %s delivered (HTTP %d)", claim.idempotency_key, response.status_code)
        return _record(claim, ActionState.CONFIRMED, status=response.status_code, others=others)
    return _record(claim, ActionState.FAILED, status=response.status_code, error=error,
                   others=others)  # fmt: skip


def _headers(claim: Any, body: str, secret: str | None) -> dict[str, str]:
    path = urlsplit(claim.args["url"]).path or "/"
    signed = {} if secret is None else signed_headers(secret, "POST", path, body.encode())
    return {
        "Content-Type": "application/json",
        "Idempotency-Key": claim.idempotency_key,
        EVENT_HEADER: claim.event,
        **signed,
    }


def _retry_later(
    claim: Any,
    error: str,
    status: int | None,
    state: ActionState | None,
    backoff: float | None = None,
) -> Delivery:
    """Try this webhook again later, with backoff. `backoff`: its receiver failed and may be
    tried again in that many seconds; this webhook is then its next probe, and the receiver's
    other webhooks are put off past it (not handed to a worker each in turn only to find the
    receiver still backed off)."""
    attempts = claim.attempts + 1
    if attempts >= MAX_ATTEMPTS:
        error = f"gave up after {attempts} attempts; the last: {error}"
        return _record(claim, ActionState.FAILED, status=status, error=error)
    ceiling = min(LAST_RETRY, FIRST_RETRY * 2 ** (attempts - 1)).total_seconds()
    retry_in = max(random.uniform(ceiling / 2, ceiling), backoff or 0.0)
    log.warning(
        "webhook %s to %s failed (%s); trying again in %.0f s",
        claim.idempotency_key, redact_url(claim.args["url"]), error, retry_in,
    )  # fmt: skip
    others = None if backoff is None else "put_off_receiver"
    _record(claim, state or ActionState.OUTCOME_UNKNOWN, status=status, error=error,
            retry_in=retry_in, others=others)  # fmt: skip
    return Delivery.RETRY


def _record(
    claim: Any,
    state: ActionState,
    *,
    status: int | None = None,
    error: str | None = None,
    retry_in: float = 0.0,
    others: str | None = None,
) -> Delivery:
    """Record the attempt's outcome, by the sender that still holds the claim: confirmed as a
    tool's action is (actions.sql confirm_action), anything else as a webhook is
    (webhooks.sql webhook_not_delivered). `others` (webhooks.sql put_off_receiver or
    bring_back_receiver) moves the receiver's other owed webhooks in the same transaction, if
    the record holds."""
    reply = None if status is None else statements.jsonb({"status": status})
    with transaction() as session:
        if state is ActionState.CONFIRMED:
            recorded = statements.execute(
                session, "confirm_action", key=claim.idempotency_key, run_id=claim.run_id,
                fence=claim.fence, result=reply, resolution=None,
                sources=list(ActionState.sources_of(state)),
            )  # fmt: skip
        else:
            recorded = statements.execute(
                session, "webhook_not_delivered", key=claim.idempotency_key, fence=claim.fence,
                state=state.value, result=reply, error=error, retry_in=retry_in,
            )  # fmt: skip
        if recorded and others is not None:
            statements.execute(session, others, **_others_params(claim, retry_in, error))
    if state is ActionState.FAILED:
        log.warning("webhook %s failed: %s", claim.idempotency_key, error)
        return Delivery.FAILED
    return Delivery.DELIVERED if state is ActionState.CONFIRMED else Delivery.RETRY


def _others_params(claim: Any, probe_in: float, error: str | None) -> dict[str, Any]:
    """The receiver's other webhooks come back after its probe (due in `probe_in`) has had the
    time to answer, and sooner only if it did (bring_back_receiver)."""
    wait = probe_in + SEND_SECONDS + MIN_DEFERRAL
    put_off = f"not sent yet: its receiver failed just before ({error}); another tries it first"
    return {"key": claim.idempotency_key, "url": claim.args["url"], "wait": wait,
            "error": put_off[:500]}  # fmt: skip


def _body(session: Session, claim: Any) -> str:
    """The event as JSON, from the transition's run_events row (or the alert): what was true
    then."""
    if "alert_id" in claim.args:
        return _alert_body(session, claim)
    event = session.get(RunEvent, claim.args["event_id"])
    assert event is not None, f"webhook {claim.idempotency_key}: its event is gone"
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


def _alert_body(session: Session, claim: Any) -> str:
    """kind, subject and message at the top level, as the alert webhook always had them."""
    alert = session.get(Alert, claim.args["alert_id"])
    assert alert is not None, f"webhook {claim.idempotency_key}: its alert is gone"
    document = {
        "id": claim.idempotency_key,
        "event": claim.event,
        "occurred_at": alert.created_at.isoformat(),
        "kind": alert.kind,
        "subject": alert.subject,
        "message": alert.message,
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"))
