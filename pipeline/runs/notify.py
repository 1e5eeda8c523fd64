"""Completion webhooks, the record's side: checking a notify_url, and handing the notifications
that are owed to a worker (pipeline/engine/notify.py sends them).

The rows themselves are written by the status triggers in the transaction of the transition
(models/notification.py), so none is lost. Who sends the first delivery task: the code that
made the transition, right after its commit (`dispatch_new_txn`); the tick sends the rest
(`dispatch_due_txn`): retries whose time has come, a delivery whose sender died (its claim
expired) and one whose task message was lost. Each delivery is a task of its own on the control
queue, so a slow receiver never holds up a step.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from sqlalchemy import text
from sqlalchemy.orm import Session

from pipeline.app import app
from pipeline.db import after_commit
from pipeline.errors import InvalidInput
from pipeline.settings import get_settings

NOTIFY_TASK = "pipeline.notify"
MAX_URL = 2000

_OWED = "state IN ('intended', 'attempted', 'outcome_unknown')"
_DUE = text(
    f"""
    UPDATE notifications SET dispatched_at = now()
     WHERE id IN (
        SELECT id FROM notifications
         WHERE {_OWED} AND next_attempt_at <= now()
           AND (lease_expires_at IS NULL OR lease_expires_at < now())
           AND (dispatched_at IS NULL OR dispatched_at < now() - make_interval(secs => :grace))
         ORDER BY next_attempt_at
         LIMIT :limit
         FOR UPDATE SKIP LOCKED)
    RETURNING id
    """
)
_NEW = text(
    f"""
    UPDATE notifications SET dispatched_at = now()
     WHERE {_OWED} AND dispatched_at IS NULL
       AND created_xid = pg_current_xact_id()::text::bigint
    RETURNING id
    """
)


def check_notify_url(url: object, what: str = "notify_url") -> str | None:
    """An http(s) URL to POST completion events to, or None. Raises InvalidInput."""
    if url is None:
        return None
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise InvalidInput(f"{what} must be a URL of at most {MAX_URL} characters")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{what} must be an http:// or https:// URL with a host")
    if get_settings().notify_secret is None:
        raise InvalidInput(
            f"{what} needs NIGHTSHIFT_NOTIFY_SECRET, which signs the events so the receiver "
            "can tell they come from nightshift"
        )
    return url.strip()


def dispatch_new_txn(session: Session) -> list[int]:
    """Send a delivery task, after the commit, for every notification this transaction's own
    transitions wrote."""
    return _dispatch(session, [row.id for row in session.execute(_NEW)])


def dispatch_due_txn(session: Session, grace: float, limit: int = 500) -> list[int]:
    """The tick: send a delivery task for every notification owed and due that no sender
    holds and no recent task is on its way to."""
    due = session.execute(_DUE, {"grace": grace, "limit": limit})
    return _dispatch(session, [row.id for row in due])


def _dispatch(session: Session, ids: list[int]) -> list[int]:
    if ids:
        queue = get_settings().control_queue
        after_commit(session, lambda: _send(ids, queue))
    return ids


def _send(ids: list[int], queue: str) -> None:
    for notification_id in ids:
        app.send_task(
            NOTIFY_TASK, kwargs={"notification_id": notification_id}, queue=queue,
            ignore_result=True,
        )  # fmt: skip
