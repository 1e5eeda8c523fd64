"""Completion webhooks and alerts' webhooks, the record's side: checking a notify_url, owing an
alert's delivery, and handing the notifications that are owed to a worker
(pipeline/delivery/ sends them).

The rows themselves are written by the status triggers in the transaction of the transition
(models/notification.py), so none is lost. Who sends the first delivery task: the code that
made the transition, right after its commit (`dispatch_new_txn`); the tick sends the rest
(`dispatch_due_txn`): retries whose time has come, a delivery whose sender died (its claim
expired) and one whose task message was lost. Each delivery is a task of its own on the control
queue, which hands the POST to the worker's own senders (pipeline/delivery/receivers.py), so a slow
receiver never holds up a step.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

import pipeline.statements as statements
from pipeline.app import app
from pipeline.db import after_commit
from pipeline.errors import InvalidInput, TargetUnresolved
from pipeline.runs.outbound import receiver_of, resolve_target
from pipeline.settings import get_settings

NOTIFY_TASK = "pipeline.notify"
MAX_URL = 2000


def check_notify_url(url: object, what: str = "notify_url") -> str | None:
    """An http(s) URL to POST completion events to, or None. Raises InvalidInput, also when it
    points where NIGHTSHIFT_NOTIFY_ALLOWED does not allow (pipeline/runs/outbound.py)."""
    if url is None:
        return None
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise InvalidInput(f"{what} must be a URL of at most {MAX_URL} characters")
    settings = get_settings()
    with contextlib.suppress(TargetUnresolved):  # checked again, resolved, at every delivery
        resolve_target(url.strip(), settings.notify_allowed, what)
    if settings.notify_secret is None:
        raise InvalidInput(
            f"{what} needs NIGHTSHIFT_NOTIFY_SECRET, which signs the events so the receiver "
            "can tell they come from nightshift"
        )
    return url.strip()


def owe_alert_txn(session: Session, alert_id: int, subject: str, url: str) -> None:
    """An alert's webhook, owed in the alert's own transaction, keyed `alert:<id>`. `url` is
    the operator's NIGHTSHIFT_ALERT_WEBHOOK_URL (not a caller's: no NIGHTSHIFT_NOTIFY_ALLOWED);
    the run or batch it is about, if any, so the row goes with them when they are deleted."""
    kind, _, about = subject.partition(":")
    run_id = None
    if kind == "run":
        with contextlib.suppress(ValueError):
            run_id = uuid.UUID(about)
    params = {"key": f"alert:{alert_id}", "alert_id": alert_id, "url": url, "run_id": run_id,
              "batch_id": about if kind == "batch" else None}  # fmt: skip
    statements.execute(session, "owe_alert", **params)


def dispatch_new_txn(session: Session) -> list[int]:
    """Send a delivery task, after the commit, for every notification this transaction's own
    transitions wrote."""
    return _dispatch(session, statements.rows(session, "dispatch_new_notifications"))


def dispatch_due_txn(session: Session, grace: float, limit: int = 500) -> list[int]:
    """The tick: send a delivery task for every notification owed and due that no sender
    holds and no recent task is on its way to."""
    return _dispatch(
        session, statements.rows(session, "dispatch_due_notifications", grace=grace, limit=limit)
    )


def _dispatch(session: Session, owed: Sequence[Row[Any]]) -> list[int]:
    """Each task names its receiver: a worker sends to one receiver one at a time."""
    tasks = [{"notification_id": row.id, "receiver": receiver_of(row.url)} for row in owed]
    if tasks:
        queue = get_settings().control_queue
        after_commit(session, lambda: _send(tasks, queue))
    return [row.id for row in owed]


def _send(tasks: list[dict[str, Any]], queue: str) -> None:
    for kwargs in tasks:
        app.send_task(NOTIFY_TASK, kwargs=kwargs, queue=queue, ignore_result=True)
