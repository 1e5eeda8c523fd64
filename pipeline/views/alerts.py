"""Budget alerts as people read them: what tripped, and whether its webhook was delivered."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from models import Alert, Notification
from pipeline.db import read_only
from pipeline.errors import redact_url
from pipeline.views.runs import plain

NOT_SENT = "not sent"
"""An alert raised with no NIGHTSHIFT_ALERT_WEBHOOK_URL: the row and the log line are all."""


def delivery_of(notification: Notification | None) -> str:
    """`confirmed`, `outcome_unknown (3 attempts)`, ...: the webhook's state, in a few words."""
    if notification is None:
        return NOT_SENT
    state = notification.state.value
    return f"{state} ({notification.attempts} attempts)" if notification.attempts > 1 else state


def list_alerts(limit: int = 50) -> list[dict[str, Any]]:
    """The newest alerts first, each with its webhook's delivery (state, attempts, error)."""
    query = (
        select(Alert, Notification)
        .outerjoin(Notification, Notification.alert_id == Alert.id)
        .order_by(Alert.created_at.desc(), Alert.id.desc())
        .limit(limit)
    )
    with read_only() as session:
        return [_shown(alert, notification) for alert, notification in session.execute(query)]


def _shown(alert: Alert, notification: Notification | None) -> dict[str, Any]:
    shown = {
        "id": alert.id,
        "kind": alert.kind,
        "subject": alert.subject,
        "message": alert.message,
        "created_at": plain(alert.created_at),
        "delivery": delivery_of(notification),
    }
    if notification is not None:
        shown["webhook"] = {
            "idempotency_key": notification.idempotency_key,
            "url": redact_url(notification.url),
            "state": notification.state.value,
            "attempts": notification.attempts,
            "response_status": notification.response_status,
            "error": notification.error,
            "last_attempt_at": plain(notification.last_attempt_at),
            "next_attempt_at": plain(notification.next_attempt_at),
        }
    return shown
