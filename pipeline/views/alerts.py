"""Budget alerts as people read them: what tripped, and whether its webhook was delivered."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, cast, select

from models import Action, ActionKind, Alert
from pipeline.db import read_only
from pipeline.errors import redact_url
from pipeline.views.runs import plain

NOT_SENT = "not sent"
"""An alert raised with no NIGHTSHIFT_ALERT_WEBHOOK_URL: the row and the log line are all."""


def delivery_of(webhook: Action | None) -> str:
    """`confirmed`, `outcome_unknown (3 attempts)`, ...: the webhook's state, in a few words."""
    if webhook is None:
        return NOT_SENT
    state = webhook.state.value
    return f"{state} ({webhook.attempts} attempts)" if webhook.attempts > 1 else state


def list_alerts(limit: int = 50) -> list[dict[str, Any]]:
    """The newest alerts first, each with its webhook's delivery (state, attempts, error)."""
    query = (
        select(Alert, Action)
        .outerjoin(
            Action,  # the alert's webhook action, by its key
            (Action.idempotency_key == "alert:" + cast(Alert.id, String))
            & (Action.kind == ActionKind.WEBHOOK),
        )
        .order_by(Alert.created_at.desc(), Alert.id.desc())
        .limit(limit)
    )
    with read_only() as session:
        return [_shown(alert, webhook) for alert, webhook in session.execute(query)]


def _shown(alert: Alert, webhook: Action | None) -> dict[str, Any]:
    shown = {
        "id": alert.id,
        "kind": alert.kind,
        "subject": alert.subject,
        "message": alert.message,
        "created_at": plain(alert.created_at),
        "delivery": delivery_of(webhook),
    }
    if webhook is not None:
        shown["webhook"] = {
            "idempotency_key": webhook.idempotency_key,
            "url": redact_url(webhook.args["url"]),
            "state": webhook.state.value,
            "attempts": webhook.attempts,
            "response_status": (webhook.result or {}).get("status"),
            "error": webhook.error,
            "last_attempt_at": plain(webhook.last_attempt_at),
            "next_attempt_at": plain(webhook.next_attempt_at),
        }
    return shown
