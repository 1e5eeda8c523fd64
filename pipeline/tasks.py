"""Thin Celery tasks: ids in, call the runtime, map the outcome. No logic lives here."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from celery.exceptions import Reject
from celery.signals import worker_init, worker_ready, worker_shutdown

from pipeline.app import app, send_step
from pipeline.engine.holders import holder_here
from pipeline.engine.notify import deliver
from pipeline.engine.step import Outcome
from pipeline.engine.time_limit import execute_bounded_step
from pipeline.errors import DatabaseUnavailable
from pipeline.registry import registry
from pipeline.runs import cancel, events, retention, schedules, start, tick, workers
from pipeline.runs.deadlines import parse_deadline
from pipeline.settings import get_settings

log = logging.getLogger("nightshift.tasks")

REQUEUE_PAUSE_SECONDS = 1.0
UNKNOWN_AGENT_HANDOFFS = 20
"""Deliveries to workers without the run's agent before the run fails (`unknown_agent`)."""


def worker_id() -> str:
    return str(holder_here(threading.current_thread().name))


@worker_init.connect
def _load_agents(**_: Any) -> None:
    """A worker with a broken agent registration stops at start, saying which and why."""
    names = sorted(registry().agents)
    log.info("agents registered on this worker: %s", ", ".join(names) or "none")


_presence: list[workers.Presence] = []


@worker_ready.connect
def _announce(sender: Any, **_: Any) -> None:
    """Heartbeats in the database: `nightshift runs` and the status page can then say when no
    worker consumes a run's queue."""
    queues = sorted(queue.name for queue in sender.task_consumer.queues)
    interval = get_settings().worker_heartbeat_seconds
    _presence.append(workers.Presence(sender.hostname, queues, interval).start())


@worker_shutdown.connect
def _withdraw(**_: Any) -> None:
    while _presence:
        _presence.pop().stop()


@app.task(name="pipeline.start_run")
def start_run(
    agent: str,
    input: dict[str, Any],
    idempotency_key: str | None = None,
    deadline: float | str | None = None,
    notify_url: str | None = None,
) -> str:
    """Start a run from another service: `start_run.delay(agent, input, key).get()` is its id.

    `deadline`: seconds from now, a duration (`"15m"`) or an ISO-8601 time with a timezone.
    `notify_url`: POSTed a signed event when the run finishes or waits for a person.
    """
    parsed = parse_deadline(deadline)
    started = start.start_run(agent, input, idempotency_key, deadline=parsed, notify_url=notify_url)
    return str(started.run_id)


@app.task(name="pipeline.notify", ignore_result=True)
def notify(notification_id: int) -> str:
    """Send one completion webhook (a run's or a batch's notify_url), or skip it if another
    sender holds it or it was delivered."""
    return deliver(notification_id).value


@app.task(
    name="pipeline.step",
    bind=True,
    acks_late=True,
    # Nobody reads a step's return value: storing it would fill the noeviction Redis.
    ignore_result=True,
    retry_on_worker_lost=True,
    max_retries=get_settings().worker_lost_max_retries,
    default_retry_delay=1,
)
def step(
    self: Any,
    run_id: str,
    agent: str | None = None,
    step: int | None = None,
    batch: str | None = None,
    handoffs: int = 0,
) -> str:
    """One durable step of a run. agent, step and batch are labels for Flower; handoffs counts
    the workers that did not know the agent."""
    leave = handoffs < UNKNOWN_AGENT_HANDOFFS
    try:
        result = execute_bounded_step(
            uuid.UUID(run_id), worker_id(), get_settings(), leave_unknown_agent=leave
        )
    except DatabaseUnavailable as exc:
        # Back in the queue for a worker that reaches PostgreSQL (acknowledged, the message
        # would be lost until the tick re-sends the run); after a pause, so that a worker cut
        # off from the database does not spin on the queue.
        time.sleep(REQUEUE_PAUSE_SECONDS)
        raise Reject(str(exc), requeue=True) from exc
    if result.outcome is Outcome.UNKNOWN_AGENT:
        send_step(
            result.run_id,
            agent=agent or "",
            step=step or 0,
            batch=batch,
            handoffs=handoffs + 1,
            countdown=1.0,
        )
    return result.outcome.value


# Control tasks send no task events: Flower's task list (it is built from events) then shows
# steps and entry points, not a tick every few seconds. Their logs still show each one.
@app.task(name="pipeline.tick", ignore_result=True, send_events=False)
def tick_task() -> dict[str, int]:
    report = tick.tick()
    return {
        "resumed": len(report.resumed),
        "woken": len(report.woken),
        "expired": len(report.expired),
        "notified": len(report.notified),
    }


@app.task(name="pipeline.fire_schedules", ignore_result=True, send_events=False)
def fire_schedules() -> dict[str, int]:
    """Beat's schedule check: fire due slots once each (Postgres decides which are due)."""
    report = schedules.check_schedules(now=datetime.now(UTC))
    return {"decisions": len(report.decisions), "errors": len(report.errors)}


@app.task(name="pipeline.start_from_event")
def start_from_event(source: str, event_id: str, payload: dict[str, Any]) -> str:
    """Start a run from another service's event: repeated deliveries return the same run id."""
    return str(events.start_from_event(source, event_id, payload).run_id)


# No `pipeline.decide` task: a Celery message carries no credential (anyone who can write to
# the broker could claim to be the pricing manager) and Flower shows every argument. People
# decide through the API, the approval webhook or the status page with their own token, or
# through the operator CLI, which records the OS user (docs/security.md).


@app.task(name="pipeline.cancel_run")
def cancel_run(run_id: str, by: str) -> str:
    """Cancel a run: a waiting one at once, a running one before its next model or tool call."""
    return cancel.cancel_run(uuid.UUID(run_id), by).status.value


@app.task(name="pipeline.cleanup", ignore_result=True, send_events=False)
def cleanup() -> dict[str, int]:
    """Daily retention: compact old finished runs that owe nothing to anyone."""
    report = retention.cleanup()
    return {"compacted": len(report.compacted), "kept": len(report.kept)}
