"""Thin Celery tasks: ids in, call the runtime, map the outcome. No logic lives here."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any, NoReturn

from celery.exceptions import Reject
from celery.signals import (
    beat_init,
    worker_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)
from sqlalchemy.exc import SQLAlchemyError

import pipeline.tracing as tracing
from pipeline.app import HANDED_OFF, app, send_step
from pipeline.delivery.receivers import senders
from pipeline.delivery.sender import deliver
from pipeline.engine.holders import holder_here
from pipeline.engine.llm import load_sdk
from pipeline.engine.step import StepOutcome
from pipeline.engine.time_limit import execute_bounded_step
from pipeline.errors import (
    Conflict,
    DatabaseUnavailable,
    Invalid,
    NightshiftError,
    NotFound,
    ScheduleError,
    SettingsError,
    UnknownAgent,
    UnknownEventSource,
)
from pipeline.logs import safe_log_lines
from pipeline.reachability import BROKER, DATABASE
from pipeline.registry import registry
from pipeline.runs import (
    bulk,
    cancel,
    external_events,
    published_outcomes,
    retention,
    schedule_list,
    schedules,
    start,
    tick,
    workers,
)
from pipeline.runs.deadlines import parse_deadline
from pipeline.settings import get_settings

log = logging.getLogger("nightshift.tasks")

CONFIG_EXIT = 78
"""Beat's exit status when its schedules are wrong, a worker's when its tracing settings are
(EX_CONFIG): a supervisor that restarts it meets the same configuration, so the status says it
is configuration, not a crash."""
REQUEUE_PAUSE_SECONDS = 1.0
HANDOFF_PAUSE_SECONDS = 1.0
"""Between two deliveries of a step or a start to workers without its agent, on average."""


def handoff_pause() -> float:
    """A hand-on's delay, drawn around HANDOFF_PAUSE_SECONDS: Redis gives a message to the
    worker blocked longest, and a worker re-polls every second (kombu's BRPOP timeout), so a
    delay of exactly one second found the worker without the agent blocked longest each time
    and gave it its own message back (70 times in a row in a test, with a worker that had the
    agent idle beside it)."""
    return HANDOFF_PAUSE_SECONDS * random.uniform(0.5, 1.5)


def worker_id() -> str:
    return str(holder_here(threading.current_thread().name))


@worker_init.connect
@beat_init.connect
def _safe_log_lines(**_: Any) -> None:
    safe_log_lines()


@worker_init.connect
def _load_agents(**_: Any) -> None:
    """A worker with a broken agent registration stops at start, saying which and why."""
    registry()


@worker_init.connect
def _load_model_sdk(**_: Any) -> None:
    load_sdk(get_settings())


@worker_init.connect
def _trace(**_: Any) -> None:
    """Spans exported as the OTEL_* variables say, or none (pipeline/tracing.py). An exporter
    nobody provides stops the worker at start: it would otherwise run untraced unnoticed."""
    try:
        tracing.configure()
    except SettingsError as exc:
        log.critical("worker stops: %s", exc)
        # SystemExit, not an Exception: Celery's signal dispatch would log one and go on.
        raise SystemExit(CONFIG_EXIT) from None


@worker_shutdown.connect
@worker_process_shutdown.connect
def _export_spans(**_: Any) -> None:
    tracing.flush()


@worker_ready.connect
def _say_agents(**_: Any) -> None:
    """Which agents this worker runs, and the settings their tools need that it lacks (said
    once Celery's logging is set up: worker_init comes before it)."""
    agents = registry().agents
    log.info("agents registered on this worker: %s", ", ".join(sorted(agents)) or "none")
    settings = get_settings()
    for name in sorted(agents):
        unset = agents[name].agent.unset_needs(settings.is_set)
        if unset:
            missing = ", ".join(f"{variable} ({tool})" for variable, tool in unset)
            log.warning(
                "agent %s: %s not set on this worker; its runs fail here (reason config)",
                name,
                missing,
            )


@beat_init.connect
def _store_schedules(**_: Any) -> None:
    """The schedules this beat fires by, stored for the workers that check them and for
    `schedules list`: a worker without the schedules file fires what beat has. A schedules
    file that is wrong, or a schedule naming an agent nobody registered, stops beat here: it
    would otherwise fire what an earlier beat stored, or fail that schedule every night."""
    try:
        ours = schedule_list.load_schedules()
        schedule_list.store_for_beat(ours, worker_id())
    except ScheduleError as exc:
        log.critical("beat stops: %s", exc)
        # SystemExit, not an Exception: Celery's signal dispatch would log one and go on.
        raise SystemExit(CONFIG_EXIT) from None
    except (NightshiftError, SQLAlchemyError) as exc:
        log.error("beat could not store its schedules (workers check their own): %s", exc)
        return
    log.info("beat stored its %d schedules: %s", len(ours), ", ".join(s.name for s in ours))


_presence: list[workers.Presence] = []


@worker_ready.connect
def _announce(sender: Any, **_: Any) -> None:
    """Heartbeats in the database: `nightshift runs` and the status page can then say when no
    worker consumes a run's queue."""
    queues = sorted(queue.name for queue in sender.task_consumer.queues)
    settings = get_settings()
    control = settings.control_queue

    def take_ticks(take: bool) -> None:
        # Through the worker's own remote control: its consumer changes what it consumes in
        # its own thread (the broker channel is not this thread's to use).
        if control not in queues:
            return
        if take:
            app.control.add_consumer(control, destination=[sender.hostname])
        else:
            app.control.cancel_consumer(control, destination=[sender.hostname])

    readiness = workers.Readiness(settings.ready_file, take_ticks)
    interval = settings.worker_heartbeat_seconds
    _presence.append(workers.Presence(sender.hostname, queues, interval, readiness).start())


@worker_shutdown.connect
def _withdraw(**_: Any) -> None:
    while _presence:
        _presence.pop().stop()


CALLERS_ERRORS = (Invalid, Conflict, NotFound)
"""What an entry point answers its caller with (`.get()` raises it), logged in one line as
Celery's "raised expected" rather than with a traceback: the caller's to fix, not the worker's."""


# max_retries None: retries are hand-ons, bounded by _hand_on's window instead of a count.
@app.task(name="pipeline.start_run", bind=True, throws=CALLERS_ERRORS, max_retries=None)
def start_run(
    self: Any,
    agent: str,
    input: dict[str, Any],
    idempotency_key: str | None = None,
    deadline: float | str | None = None,
    notify_url: str | None = None,
) -> str:
    """Start a run from another service: `start_run.delay(agent, input, key).get()` is its id.

    `deadline`: seconds from now, a duration (`"15m"`) or an ISO-8601 time with a timezone.
    `notify_url`: POSTed a signed event when the run finishes or waits for a person.
    A worker without `agent` hands the start on (see `_hand_on`).
    """
    parsed = parse_deadline(deadline)
    try:
        with tracing.continuing(self.request):  # the caller's traceparent header
            started = start.start_run(
                agent, input, idempotency_key, deadline=parsed, notify_url=notify_url
            )
    except UnknownAgent as exc:
        _hand_on(self, f"agent {agent!r}", exc)
    return str(started.run_id)


def _hand_on(task: Any, what: str, exc: UnknownAgent | UnknownEventSource) -> NoReturn:
    """An entry point for an agent this worker lacks: sent again under the same task id (the
    caller's `.get()` keeps waiting), a second later, for a worker that has it, for up to
    NIGHTSHIFT_UNKNOWN_AGENT_SECONDS, as a step is; then the caller's `.get()` raises the
    error, naming the agent and this worker. Nothing was recorded."""
    handoffs = task.request.retries
    window = get_settings().unknown_agent_seconds
    if handoffs * HANDOFF_PAUSE_SECONDS < window:
        level = logging.WARNING if handoffs == 0 else logging.INFO
        log.log(level, "%s is not registered here; handing the start on to another worker", what)
        raise task.retry(countdown=handoff_pause())
    raise type(exc)(
        f"no worker that took this start in {window:g} s (NIGHTSHIFT_UNKNOWN_AGENT_SECONDS) has "
        f"{what}; the last was {task.request.hostname}: {exc}"
    ) from None


@app.task(name="pipeline.notify", ignore_result=True)
def notify(key: str = "", receiver: str = "", notification_id: int | None = None) -> str:
    """Hand one webhook action (a run's or a batch's notify_url, an alert's), named by its
    key, to this worker's senders, off the step threads, in its receiver's queue; when there
    is no room, the tick sends it again later. `notification_id`: a task an older release
    queued before the upgrade moved its row to actions; the tick sends that webhook again."""
    if not key:
        return "stale"
    return "queued" if senders().hand_off(deliver, key, receiver) else "busy"


@app.task(
    name="pipeline.step",
    bind=True,
    acks_late=True,
    # Nobody reads a step's return value: storing it would fill the noeviction Redis.
    ignore_result=True,
    # Its max_retries (NIGHTSHIFT_WORKER_LOST_MAX_RETRIES) is an annotation in celeryconfig:
    # the settings are read when Celery configures itself, not when this module is imported.
    retry_on_worker_lost=True,
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
    settings = get_settings()
    # A count of hand-offs a second apart, so that a mixed fleet has the whole window to start
    # a worker that has the agent (kept in the message: no worker has to remember it).
    leave = handoffs * HANDOFF_PAUSE_SECONDS < settings.unknown_agent_seconds
    try:
        result = execute_bounded_step(
            uuid.UUID(run_id), worker_id(), settings, leave_unknown_agent=leave
        )
    except Exception as exc:
        if BROKER.is_outage(exc):  # the step committed; the tick sends its run again
            BROKER.failed(exc)
            return "next step not sent"
        outage = DATABASE.is_outage(exc)
        if outage:  # said once per outage, instead of Celery's traceback per message
            DATABASE.failed(exc)
        if isinstance(exc, DatabaseUnavailable):  # no claim: nothing was done
            if not outage:  # every kept connection stayed busy for a lease
                log.warning("%s; sending the step again", exc)
            return _send_again(exc, run_id, agent, step, batch, handoffs, self.request)
        if not outage:
            raise
        # PostgreSQL went away mid-step: what the step did after its last commit is undone
        # and its lease lapses; the tick then hands the run to a worker.
        return "database_unreachable"
    DATABASE.reached()
    BROKER.reached()  # its message came, and any message it sent went
    if result.outcome is StepOutcome.UNKNOWN_AGENT:
        send_step(
            result.run_id,
            agent=agent or "",
            step=step or 0,
            batch=batch,
            handed_off=self.request.get(HANDED_OFF),
            handoffs=handoffs + 1,
            countdown=handoff_pause(),
        )
    return result.outcome.value


def _send_again(
    exc: DatabaseUnavailable,
    run_id: str,
    agent: str | None,
    step: int | None,
    batch: str | None,
    handoffs: int,
    request: Any,
) -> str:
    """Back in the queue for a worker that reaches PostgreSQL (dropped, the message would be
    lost until the tick re-sends the run); after a pause, so that a worker cut off from the
    database does not spin on the queue. Sent again rather than rejected: Celery logs every
    rejection with a traceback. The same hand-off: its time goes with it."""
    time.sleep(REQUEUE_PAUSE_SECONDS)
    try:
        send_step(uuid.UUID(run_id), agent=agent or "", step=step or 0, batch=batch,
                  handed_off=request.get(HANDED_OFF), handoffs=handoffs)  # fmt: skip
    except Exception:  # the broker is away too: Celery puts the message back itself
        raise Reject(str(exc), requeue=True) from None
    return "requeued"


# Control tasks send no task events: Flower's task list (it is built from events) then shows
# steps and entry points, not a tick every few seconds. Their logs still show each one.
@app.task(name="pipeline.tick", ignore_result=True, send_events=False)
def tick_task() -> dict[str, int] | str:
    # PostgreSQL away (said once, not a traceback a tick): the next tick finds what this missed,
    # on a worker that reaches it (this one takes no tick until it does: workers.Readiness).
    return DATABASE.attempt(_tick_once) or "database_unreachable"


def _tick_once() -> dict[str, int]:
    report = tick.tick()
    published = published_outcomes.publish_outcomes()
    return {
        "outcomes_published": published,
        "resumed": len(report.resumed),
        "woken": len(report.woken),
        "expired": len(report.expired),
        "notified": len(report.notified),
    }


@app.task(name="pipeline.fire_schedules", ignore_result=True, send_events=False)
def fire_schedules() -> dict[str, int]:
    """Beat's schedule check: fire due slots once each (Postgres decides which are due)."""
    report = DATABASE.attempt(lambda: schedules.check_schedules(now=datetime.now(UTC)))
    if report is None:  # PostgreSQL away: a slot missed now is still due at the next check
        return {}
    return {"decisions": len(report.decisions), "errors": len(report.errors)}


@app.task(name="pipeline.start_from_event", bind=True, throws=CALLERS_ERRORS, max_retries=None)
def start_from_event(self: Any, source: str, event_id: str, payload: dict[str, Any]) -> str:
    """Start a run from another service's event: repeated deliveries return the same run id.
    A worker without the source's agent hands the event on (see `_hand_on`)."""
    try:
        with tracing.continuing(self.request):
            return str(external_events.start_from_event(source, event_id, payload).run_id)
    except (UnknownAgent, UnknownEventSource) as exc:
        _hand_on(self, f"event source {source!r}", exc)


# No `pipeline.decide` task: a Celery message carries no credential (anyone who can write to
# the broker could claim to be the pricing manager) and Flower shows every argument. People
# decide through the API, the approval webhook or the status page with their own token, or
# through the operator CLI, which records the OS user (docs/security.md).


BROKER_CLIENT = "broker client"
"""Who cancelled, as a run records a cancellation sent through the broker."""


@app.task(name="pipeline.cancel_run")
def cancel_run(run_id: str, by: str | None = None) -> str:
    """Cancel a run: a waiting one at once, a running one before its next model or tool call.
    Recorded as cancelled by BROKER_CLIENT: a message carries no credential, so `by` is
    whatever its sender wrote (still accepted, and ignored)."""
    return cancel.cancel_run(uuid.UUID(run_id), BROKER_CLIENT).status.value


@app.task(name=bulk.BULK_TASK, ignore_result=True, acks_late=False, retry_on_worker_lost=False)
def bulk_operation(operation_id: str) -> int | str:
    """Apply a bulk operation's items not done yet. Acknowledged on receipt, not late (as
    every other task is): if this worker dies, the tick sends the operation again once its
    lease passed; a redelivery an hour later would only find it finished."""
    # PostgreSQL away (said once, not a traceback): the item in flight rolled back, and the
    # tick sends the operation again once its lease passed.
    applied = DATABASE.attempt(lambda: bulk.process(uuid.UUID(operation_id)))
    return "database_unreachable" if applied is None else applied


@app.task(name="pipeline.cleanup", ignore_result=True, send_events=False)
def cleanup() -> dict[str, int]:
    """Daily retention: redact old finished runs, delete old compact records."""
    report = DATABASE.attempt(retention.cleanup)
    if report is None:  # PostgreSQL away: tomorrow's cleanup does today's too
        return {}
    return {
        "compacted": len(report.compacted),
        "deleted": len(report.deleted),
        "kept": len(report.kept),
    }
