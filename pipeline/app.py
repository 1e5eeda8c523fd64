"""The Celery application, the one way a step message is sent (after the commit that made the
step runnable), and the guard that keeps a worker alive across a Redis restart. Configuration
lives in the top-level `celeryconfig` module."""

from __future__ import annotations

import uuid
from typing import Any

import redis.exceptions
from celery import Celery
from celery.signals import beat_init
from kombu.transport import redis as kombu_redis
from sqlalchemy.orm import Session

from pipeline.db import after_commit

app = Celery("nightshift")
app.config_from_object("celeryconfig")
app.conf.imports = ("pipeline.tasks",)

STEP_TASK = "pipeline.step"


@beat_init.connect
def _beat_sends_no_events(sender: Any, **_: Any) -> None:
    """Beat sends only control tasks, which Flower need not list: no `task-sent` events."""
    sender.app.conf.task_send_sent_event = False


_MARK = "_nightshift_detached_guard"
_PENDING = "nightshift.pending_steps"


def send_step(
    run_id: uuid.UUID,
    *,
    agent: str,
    step: int = 0,
    batch: str | None = None,
    handoffs: int = 0,
    countdown: float | None = None,
) -> None:
    """Send `pipeline.step` now. Everything is a keyword so Flower's task list reads as
    "which run, which agent, which step"; only run_id means anything to the task."""
    kwargs: dict[str, Any] = {"run_id": str(run_id), "agent": agent, "step": step, "batch": batch}
    if handoffs:
        kwargs["handoffs"] = handoffs
    # Nobody reads a step's return value: no result stored, no result subscription here, and
    # no AsyncResult built (it builds the result backend, once per thread: a step runs in a
    # new thread each time, and redis-py's client reads package metadata: ~1.5 ms a send).
    # Not added to a sending task's children either (a stored result would list it).
    app.send_task(
        STEP_TASK,
        kwargs=kwargs,
        countdown=countdown,
        ignore_result=True,
        result_cls=_Sent,
        add_to_parent=False,
    )


class _Sent:
    """What send_task returns for a message whose result nobody reads."""

    ignored = True

    def __init__(self, task_id: str) -> None:
        self.id = task_id


def send_step_after_commit(
    session: Session, run_id: uuid.UUID, *, agent: str, step: int = 0, batch: str | None = None
) -> None:
    """Send the run's step once this transaction commits; a run is sent at most once per
    transaction, however many changes in it made the run runnable."""
    pending: dict[uuid.UUID, dict[str, Any]] | None = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = {}
        after_commit(session, lambda: _send_all(pending))
    pending[run_id] = {"agent": agent, "step": step, "batch": batch}


def _send_all(pending: dict[uuid.UUID, dict[str, Any]]) -> None:
    for run_id, labels in pending.items():
        send_step(run_id, **labels)


def install_broker_guard() -> None:
    """Keep a worker alive when its Redis broker restarts (kombu 5.7's Redis transport): patch
    kombu's Redis channel once; calling it again does nothing.

    On a lost broker connection the consumer first `collect()`s the connection, which closes its
    channels and then detaches the transport from it (`transport.client = None`), and then
    `close()`s it again. When the task channel was waiting on a BRPOP, its first close stops at
    reading that BRPOP's reply (a ConnectionError) before it is marked closed, so the second close
    goes on to give back the unacknowledged messages. Building the Redis client for that reads
    `transport.client.hostname`, and `transport.client` is None by then: an AttributeError, which
    is not a connection error, so the worker exits with "Unrecoverable error". A step that was
    running during the outage later acknowledges its message on that same dead channel and fails
    the same way.

    A channel whose transport has been detached can never reach Redis again, so here it raises the
    ConnectionError that all those callers already handle: the worker logs it and reconnects.
    Nothing changes for a live channel.
    """
    channel_cls = kombu_redis.Channel
    if getattr(channel_cls._connparams, _MARK, False):
        return
    original = channel_cls._connparams

    def _connparams(self: Any, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or transport.client is None:
            raise redis.exceptions.ConnectionError(
                "this channel's broker connection is already closed"
            )
        return original(self, asynchronous=asynchronous)

    setattr(_connparams, _MARK, True)
    channel_cls._connparams = _connparams  # type: ignore[method-assign]


# Before any broker connection exists: a Redis restart must not kill the worker.
install_broker_guard()
