"""The Celery application and the one way a step message is sent (after the commit that made
the step runnable). Configuration lives in the top-level `celeryconfig` module; what nightshift
changes in kombu and Celery themselves is in pipeline/celery_patches.py, installed here before
any broker connection exists."""

from __future__ import annotations

import json
import math
import uuid
from typing import Any, Protocol

from celery import Celery
from celery.beat import PersistentScheduler, ScheduleEntry, SchedulingError
from celery.signals import beat_init
from sqlalchemy import text
from sqlalchemy.orm import Session

from pipeline.celery_patches import install_patches
from pipeline.db import after_commit
from pipeline.process_wide import ProcessWide
from pipeline.reachability import BROKER

# Before any broker connection exists: a Redis restart must not kill the worker.
install_patches()

app = Celery("nightshift")
app.config_from_object("celeryconfig")
app.conf.imports = ("pipeline.tasks",)

STEP_TASK = "pipeline.step"


@beat_init.connect
def _beat_sends_no_events(sender: Any, **_: Any) -> None:
    """Beat sends only control tasks, which Flower need not list: no `task-sent` events."""
    sender.app.conf.task_send_sent_event = False


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


HANDED_OFF = "handed_off"
"""A step message's header: when its run was handed to this step, in PostgreSQL's clock (epoch
seconds: the `runs.updated_at` its hand-off wrote). The tick compares runs with the oldest
queued messages' (`queued_since`)."""


def send_step(
    run_id: uuid.UUID,
    *,
    agent: str,
    step: int = 0,
    batch: str | None = None,
    handed_off: float | None = None,
    handoffs: int = 0,
    countdown: float | None = None,
) -> None:
    """Send `pipeline.step` now. Everything is a keyword so Flower's task list reads as
    "which run, which agent, which step"; only run_id means anything to the task.
    `handed_off`: the hand-off's time (HANDED_OFF); a message sent again for the same hand-off
    carries the first one's."""
    kwargs: dict[str, Any] = {"run_id": str(run_id), "agent": agent, "step": step, "batch": batch}
    if handoffs:
        kwargs["handoffs"] = handoffs
    step_queue().send(kwargs, countdown, handed_off)


def step_kwargs_repr(kwargs: dict[str, Any]) -> str:
    """What Flower's kwargs column shows of a step: agent, step and a short run id first, so
    they fit the column; the whole run id and batch after them for Flower's `kwargs:run_id=`
    search (it reads this back as a dict literal)."""
    shown = {"agent": kwargs["agent"], "step": kwargs["step"], "run": kwargs["run_id"][:8]}
    return repr(shown | kwargs)


def queued_since(queue: str, looked_at: int = 20) -> float:
    """The earliest hand-off (HANDED_OFF) among the `looked_at` oldest messages waiting in
    `queue`. Every step message still queued was sent after those (first in, first out), so a
    run handed off well before this time has no message left in the queue (the tick's guard).

    inf when nothing waits. -inf when messages wait but none of those read says (another
    producer's, a `.delay()` entry point, a sender older than the header): then nobody can
    tell which runs still have a message queued.

    The messages' own header, not their run's row: the oldest message is the next one a worker
    takes, and its claim rewrites the row's updated_at at once (comparing with that re-sent
    every child of a night still queued behind it: 10,901 re-sends for 10,000 children).
    """
    return step_queue().queued_since(queue, looked_at)


class StepQueue(Protocol):
    """Where this process's step messages go: the broker (`BrokerQueue`), or, in a test,
    pipeline.testing's in-process queue, which runs each step as a worker's task would."""

    def send(
        self, kwargs: dict[str, Any], countdown: float | None, handed_off: float | None
    ) -> None:
        """One `pipeline.step` message with these keyword arguments and hand-off time."""

    def queued_since(self, queue: str, looked_at: int) -> float:
        """See `queued_since`."""


class BrokerQueue:
    """Step messages through Celery to the broker."""

    def send(
        self, kwargs: dict[str, Any], countdown: float | None, handed_off: float | None
    ) -> None:
        # Nobody reads a step's return value: no result stored, no result subscription here,
        # and no AsyncResult built (it builds the result backend, once per thread: a step runs
        # in a new thread each time, and redis-py's client reads package metadata: ~1.5 ms a
        # send). Not added to a sending task's children either (a stored result would list it).
        app.send_task(
            STEP_TASK,
            kwargs=kwargs,
            kwargsrepr=step_kwargs_repr(kwargs),
            countdown=countdown,
            ignore_result=True,
            result_cls=_Sent,
            add_to_parent=False,
            headers=None if handed_off is None else {HANDED_OFF: handed_off},
        )

    def queued_since(self, queue: str, looked_at: int) -> float:
        """kombu's Redis list: the next message a worker takes is its last element."""
        with app.connection_for_read() as connection:
            client = connection.default_channel.client
            raw = client.lrange(queue, -looked_at, -1)
        if not raw:
            return math.inf
        told = [_handed_off(message) for message in raw]
        return min((when for when in told if when is not None), default=-math.inf)


def _handed_off(message: bytes) -> float | None:
    try:
        headers = json.loads(message)["headers"]
        if headers.get("task") != STEP_TASK:
            return None
        return float(headers[HANDED_OFF])
    except (ValueError, KeyError, TypeError):  # another producer's message, or no header
        return None


step_queue: ProcessWide[StepQueue] = ProcessWide(BrokerQueue)
"""This process's step queue: the broker, unless a block put another in force
(`step_queue.replaced_by(...)`, what pipeline.testing does)."""


class _Sent:
    """What send_task returns for a message whose result nobody reads."""

    ignored = True

    def __init__(self, task_id: str) -> None:
        self.id = task_id


_NOW = text("SELECT CAST(extract(epoch FROM now()) AS float8)")


def send_step_after_commit(
    session: Session, run_id: uuid.UUID, *, agent: str, step: int = 0, batch: str | None = None
) -> None:
    """Send the run's step once this transaction commits; a run is sent at most once per
    transaction, however many changes in it made the run runnable. The message says when the
    run was handed off: this transaction's now(), which every hand-off writes to updated_at."""
    pending: _Pending | None = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = _Pending(session.execute(_NOW).scalar_one())
        after_commit(session, pending.send)
    pending.runs[run_id] = {"agent": agent, "step": step, "batch": batch}


class _Pending:
    """The steps a transaction hands off, sent after its commit."""

    def __init__(self, handed_off: float) -> None:
        self.handed_off = handed_off
        self.runs: dict[uuid.UUID, dict[str, Any]] = {}

    def send(self) -> None:
        for run_id, labels in self.runs.items():
            send_step(run_id, handed_off=self.handed_off, **labels)
