"""Completion webhooks and alerts' webhooks, the record's side: checking a notify_url, owing an
alert's webhook, and handing the webhooks that are owed to a worker (pipeline/delivery/ sends
them).

They are actions of kind `webhook` (models/action.py): a completion webhook is recorded by the
status triggers in the transaction of the transition, so none is lost. Who sends the first
delivery task: the code that made the transition, right after its commit (`dispatch_new_txn`);
the tick sends the rest (`dispatch_due_txn`): retries whose time has come, a delivery whose
sender died (its claim expired) and one whose task message was lost. Each delivery is a task
of its own on the control queue, which hands the POST to the worker's own senders
(pipeline/delivery/receivers.py), so a slow receiver never holds up a step.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row
from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import ActionKind, ActionState
from pipeline.app import app
from pipeline.db import after_commit
from pipeline.errors import InvalidInput, TargetUnresolved
from pipeline.runs.outbound import receiver_of, resolve_target
from pipeline.settings import get_settings

NOTIFY_TASK = "pipeline.notify"
MAX_URL = 2000
ALERT_EVENT = "alert"
"""An alert's webhook's event (its action's `tool`; a completion webhook's is run.finished,
run.waiting, batch.finished or batch.waiting)."""


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
    """An alert's webhook, an action recorded in the alert's own transaction, keyed
    `alert:<id>`. `url` is the operator's NIGHTSHIFT_ALERT_WEBHOOK_URL (not a caller's: no
    NIGHTSHIFT_NOTIFY_ALLOWED); the run or batch it is about, if any, so the row goes with them
    when they are deleted."""
    kind, _, about = subject.partition(":")
    run_id = None
    if kind == "run":
        with contextlib.suppress(ValueError):
            run_id = uuid.UUID(about)
    statements.execute(
        session, "record_action", id=uuid.uuid4(), key=f"alert:{alert_id}",
        kind=ActionKind.WEBHOOK, run_id=run_id, batch_id=about if kind == "batch" else None,
        tool_use_id=None, tool=ALERT_EVENT, service=ActionKind.WEBHOOK.value,
        args=statements.jsonb({"url": url, "alert_id": alert_id}), args_hash=None,
        state=ActionState.INTENDED, requires_approval=False, approvers=statements.jsonb([]),
    )  # fmt: skip


def dispatch_new_txn(session: Session) -> list[str]:
    """Send a delivery task, after the commit, for every webhook this transaction's own
    transitions recorded; their keys."""
    return _dispatch(session, statements.rows(session, "dispatch_new_webhooks"))


def dispatch_due_txn(session: Session, grace: float, limit: int = 500) -> list[str]:
    """The tick: send a delivery task for every webhook owed and due that no sender holds and
    no recent task is on its way to; their keys."""
    return _dispatch(
        session, statements.rows(session, "dispatch_due_webhooks", grace=grace, limit=limit)
    )


def _dispatch(session: Session, owed: Sequence[Row[Any]]) -> list[str]:
    """Each task names its webhook by key and its receiver: a worker sends to one receiver
    one at a time."""
    tasks = [{"key": row.idempotency_key, "receiver": receiver_of(row.url)} for row in owed]
    if tasks:
        queue = get_settings().control_queue
        after_commit(session, lambda: _send(tasks, queue))
    return [row.idempotency_key for row in owed]


def _send(tasks: list[dict[str, Any]], queue: str) -> None:
    for kwargs in tasks:
        app.send_task(NOTIFY_TASK, kwargs=kwargs, queue=queue, ignore_result=True)
