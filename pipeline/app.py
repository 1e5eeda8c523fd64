"""The Celery application, the one way a step message is sent (after the commit that made the
step runnable), the guard that keeps a worker alive across a Redis restart, a second Ctrl-C
that ends a threads worker at once, and a dead prefork pool child noticed at once.
Configuration lives in the top-level `celeryconfig` module."""

from __future__ import annotations

import base64
import json
import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import redis.exceptions
from celery import Celery, platforms
from celery.beat import PersistentScheduler, ScheduleEntry, SchedulingError
from celery.concurrency.base import BasePool
from celery.signals import beat_init, worker_init, worker_ready, worker_shutting_down
from kombu.transport import redis as kombu_redis
from sqlalchemy.orm import Session

from pipeline.db import after_commit
from pipeline.prefork import reap_dead_children_promptly
from pipeline.reachability import BROKER

app = Celery("nightshift")
app.config_from_object("celeryconfig")
app.conf.imports = ("pipeline.tasks",)

STEP_TASK = "pipeline.step"
log = logging.getLogger("nightshift.worker")


@beat_init.connect
def _beat_sends_no_events(sender: Any, **_: Any) -> None:
    """Beat sends only control tasks, which Flower need not list: no `task-sent` events."""
    sender.app.conf.task_send_sent_event = False


_MARK = "_nightshift_detached_guard"
_PENDING = "nightshift.pending_steps"


class Scheduler(PersistentScheduler):
    """Beat's scheduler (celeryconfig's beat_scheduler): Celery's own, with a broker that is
    away said once, by BROKER. Celery logs each send that fails with its stack and traceback
    (celery.beat.Scheduler.apply_entry): one a second, for the tick, while Redis is away."""

    def apply_async(
        self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        try:
            result = super().apply_async(entry, producer, advance, **kwargs)
        except SchedulingError as exc:
            lost = exc.__context__  # Celery re-raises the send's failure as a SchedulingError
            if lost is None or not BROKER.is_outage(lost):
                raise
            BROKER.failed(lost)  # the entry is due again at its next time: nothing piles up
            return None
        BROKER.reached()
        return result


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
        kwargsrepr=step_kwargs_repr(kwargs),
        countdown=countdown,
        ignore_result=True,
        result_cls=_Sent,
        add_to_parent=False,
    )


def step_kwargs_repr(kwargs: dict[str, Any]) -> str:
    """What Flower's kwargs column shows of a step: agent, step and a short run id first, so
    they fit the column; the whole run id and batch after them for Flower's `kwargs:run_id=`
    search (it reads this back as a dict literal)."""
    shown = {"agent": kwargs["agent"], "step": kwargs["step"], "run": kwargs["run_id"][:8]}
    return repr(shown | kwargs)


def oldest_queued_run(queue: str, looked_at: int = 20) -> uuid.UUID | None:
    """The run of the oldest step message still waiting in `queue` (kombu's Redis list: the
    next message a worker takes is its last element), or None when no step waits. Looks at
    the `looked_at` oldest messages (the queue also carries `.delay()` entry points)."""
    with app.connection_for_read() as connection:
        client = connection.default_channel.client
        raw = client.lrange(queue, -looked_at, -1)
    for message in reversed(raw):
        try:
            envelope = json.loads(message)
            if envelope["headers"].get("task") != STEP_TASK:
                continue
            _, kwargs, _ = json.loads(base64.b64decode(envelope["body"]))
            return uuid.UUID(kwargs["run_id"])
        except (ValueError, KeyError, TypeError):  # another producer's message: not a step
            continue
    return None


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


_CLIENT = "_nightshift_client"


def keep_publish_clients() -> None:
    """One Redis client a channel for its publishes and acks (kombu 5.7's Redis transport
    builds a new `redis.Redis` around the channel's connection pool for each: ~0.3 ms of CPU a
    step message, most of what kombu adds to a publish). The client is rebuilt whenever the
    channel's pool is (after a fork, or a failed connect), and a client passed in is used as
    before. Calling it again does nothing."""
    channel_cls = kombu_redis.Channel
    if getattr(channel_cls.conn_or_acquire, _MARK, False):
        return

    @contextmanager
    def conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        pool = self.pool
        kept = self.__dict__.get(_CLIENT)
        if kept is None or kept[0] is not pool:
            kept = self.__dict__[_CLIENT] = (pool, self._create_client())
        yield kept[1]

    setattr(conn_or_acquire, _MARK, True)
    channel_cls.conn_or_acquire = conn_or_acquire  # type: ignore[method-assign]


# Before any broker connection exists: a Redis restart must not kill the worker.
install_broker_guard()
keep_publish_clients()


class _LostAck(logging.Filter):
    """A step that ran while Redis was away acknowledges its message on the dead connection:
    kombu logs that as CRITICAL with a traceback (kombu.message.Message.ack_log_error). It is
    harmless (Redis hands the message out again, and the run's lease refuses the duplicate), so
    it is one WARNING line saying so."""

    def filter(self, record: logging.LogRecord) -> bool:
        lost = record.exc_info[1] if record.exc_info else None
        if str(record.msg).startswith("Couldn't ack") and lost and BROKER.is_outage(lost):
            record.msg = f"{record.getMessage()} (harmless: its run's lease refuses a redelivery)"
            record.args, record.exc_info, record.exc_text = None, None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


@worker_init.connect
def _quiet_lost_acks(**_: Any) -> None:
    logger = logging.getLogger("celery.worker.request")
    if not any(isinstance(f, _LostAck) for f in logger.filters):
        logger.addFilter(_LostAck())


@worker_init.connect
def _reap_promptly(**_: Any) -> None:
    """A prefork worker re-sends a dead pool child's step at once (pipeline/prefork.py)."""
    reap_dead_children_promptly()


# A second Ctrl-C is Celery's cold shutdown: it cancels each step in flight through
# pool.terminate_job, which the threads pool does not have (celery/concurrency/base.py), so it
# logs `TaskPool does not implement kill_job` with tracebacks, and then still waits for every
# step to end (threads cannot be stopped). A threads worker exits at once instead; its steps'
# leases lapse and the tick hands their runs to another worker, as after a crash.
COLD_SHUTDOWN_EXIT = 1
"""The exit status of Celery's own cold shutdown (EX_FAILURE)."""
_cannot_cancel_steps: list[bool] = []


@worker_ready.connect
def _note_pool(sender: Any, **_: Any) -> None:
    pool = getattr(sender, "pool", None)
    _cannot_cancel_steps[:] = [
        pool is not None and type(pool).terminate_job is BasePool.terminate_job
    ]


@worker_shutting_down.connect
def _second_ctrl_c_exits(sig: str, how: str, **_: Any) -> None:
    """After the first Ctrl-C (Celery has just made the next one its cold shutdown)."""
    if sig == "SIGINT" and how == "Warm" and _cannot_cancel_steps == [True]:
        platforms.signals["SIGINT"] = _exit_now


def _exit_now(signum: int, frame: FrameType | None) -> None:
    log.warning(
        "cold shutdown: the steps in flight are resumed by another worker after their lease"
    )
    logging.shutdown()  # flushes the line: os._exit skips the interpreter's own exit
    os._exit(COLD_SHUTDOWN_EXIT)
