"""The Celery application and the one way a step message is sent (after the commit that made
the step runnable). Configuration lives in the top-level `celeryconfig` module; what nightshift
changes in kombu and Celery themselves is in pipeline/celery_patches.py, installed here before
any broker connection exists."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import Any, Protocol

from celery import Celery
from celery.beat import PersistentScheduler, ScheduleEntry, SchedulingError
from celery.signals import beat_init, before_task_publish
from sqlalchemy import text
from sqlalchemy.orm import Session

import pipeline.tracing as tracing
from pipeline.celery_patches import install_patches
from pipeline.db import after_commit
from pipeline.process_wide import ProcessWide
from pipeline.reachability import BROKER
from pipeline.step_messages import (
    HANDED_OFF,
    STEP_TASK,
    Step,
    StepMessages,
    eta_of,
    push,
    step_kwargs_repr,
)

# Before any broker connection exists: a Redis restart must not kill the worker.
install_patches()

app = Celery("nightshift")
app.config_from_object("celeryconfig")
app.conf.imports = ("pipeline.tasks",)


@beat_init.connect
def _beat_sends_no_events(sender: Any, **_: Any) -> None:
    """Beat sends only control tasks, which Flower need not list: no `task-sent` events."""
    sender.app.conf.task_send_sent_event = False


# A task sent within a trace carries it (a step message, built apart, carries its run's in
# the run's row instead).
before_task_publish.connect(tracing.inject_into_message)

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
    handed_off: float | None = None,
    handoffs: int = 0,
    countdown: float | None = None,
) -> None:
    """Send `pipeline.step` now. Everything is a keyword so Flower's task list reads as
    "which run, which agent, which step"; only run_id means anything to the task.
    `handed_off`: the hand-off's time (HANDED_OFF); a message sent again for the same hand-off
    carries the first one's."""
    step_queue().send([Step(step_kwargs(run_id, agent, step, batch, handoffs), handed_off,
                            countdown)])  # fmt: skip


def step_kwargs(
    run_id: uuid.UUID, agent: str, step: int, batch: str | None, handoffs: int = 0
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"run_id": str(run_id), "agent": agent, "step": step, "batch": batch}
    if handoffs:
        kwargs["handoffs"] = handoffs
    return kwargs


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

    def send(self, steps: Sequence[Step]) -> None:
        """`pipeline.step` messages, in this order."""

    def queued_since(self, queue: str, looked_at: int) -> float:
        """See `queued_since`."""


class BrokerQueue:
    """Step messages to the broker's queue: standard Celery task messages built from a template
    (pipeline/step_messages.py) and pushed onto the queue's Redis list through a producer of
    the app's pool (the connection and channel every publish of this process uses), many in
    one command. Nobody reads a step's return value: none is stored (`ignore_result`)."""

    def __init__(self) -> None:
        limits = (app.conf.task_time_limit, app.conf.task_soft_time_limit)
        self._messages = StepMessages(app.conf.task_default_queue, limits)

    def send(self, steps: Sequence[Step]) -> None:
        sent: list[tuple[str, Step]] = []

        def encoded() -> Iterator[bytes]:
            for step in steps:
                task_id, message = self._messages.encode(step)
                sent.append((task_id, step))
                yield message

        with app.producer_or_acquire() as producer:
            with producer.channel.conn_or_acquire() as client:
                push(client, self._messages.queue, encoded())
            if app.conf.task_send_sent_event:  # NIGHTSHIFT_TASK_EVENTS: Flower lists them
                for task_id, step in sent:
                    self._sent_event(producer, task_id, step)

    def _sent_event(self, producer: Any, task_id: str, step: Step) -> None:
        """The `task-sent` event Celery's send_task publishes, with the same fields."""
        queue = self._messages.queue
        fields = {
            "uuid": task_id, "root_id": task_id, "parent_id": None, "name": STEP_TASK,
            "args": "()", "kwargs": step_kwargs_repr(step.kwargs), "retries": 0,
            "eta": eta_of(step.countdown), "expires": None, "queue": queue, "exchange": "",
            "routing_key": queue,
        }  # fmt: skip
        self._events.publish("task-sent", fields, producer)

    @cached_property
    def _events(self) -> Any:
        """Publishes events through the producer it is given, as send_task's does."""
        return app.events.Dispatcher(enabled=False)

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
        step_queue().send(
            [
                Step(step_kwargs(run_id, **labels), self.handed_off)
                for run_id, labels in self.runs.items()
            ]
        )
