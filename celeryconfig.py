"""Celery settings for nightshift. The fixed ones are this module's names; the ones that come
from nightshift's own settings (`from_settings`: the URLs, queues, limits) are computed when
Celery's loader first reads this module, as the app configures itself. Importing it reads no
environment and starts nothing (with no URLs set, the broker URL starts the embedded Redis).

Why each reliability setting is what it is: the comment beside it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from kombu import Queue

from beat_schedule import beat_entries
from pipeline.db import broker_url as configured_broker_url
from pipeline.settings import Settings, get_settings

# .delay() callers in other services read the run id from the result; results expire in a day.
# Only those entry points keep one: steps, the tick and the schedule check store nothing.
result_expires = 24 * 3600
broker_connection_retry_on_startup = True

# A step is acknowledged only after it ran, so a dead worker's message is delivered again.
task_acks_late = True
worker_prefetch_multiplier = 1
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
result_accept_content = ["json"]

# A pool child that dies is retried a bounded number of times (reject_on_worker_lost loops forever).
task_retry_on_worker_lost = True
# A step running when the broker connection drops finishes; it is not killed. Its ack cannot
# reach the new connection, so Redis hands the message out again after the visibility timeout,
# and the step's Postgres lease refuses that duplicate. Cancelling cannot stop a thread anyway
# (the threads pool has no terminate), and on prefork it would throw away the step's work.
# Celery 6 turns this on by default, hence explicit. The Redis-restart crash itself is handled
# by pipeline.celery_patches.install_broker_guard.
worker_cancel_long_running_tasks_on_connection_loss = False

# No started state is stored: steps keep no result.
task_track_started = False

timezone = "UTC"
enable_utc = True

# Celery's persistent scheduler, saying a broker outage once instead of a traceback a send.
beat_scheduler = "pipeline.app:Scheduler"

# Steps mostly wait on the network: threads keep many in flight per process.
worker_pool = "threads"
worker_hijack_root_logger = False


def from_settings(settings: Settings) -> dict[str, Any]:
    """The Celery settings that follow nightshift's own."""
    broker = configured_broker_url(settings)
    visibility = {"visibility_timeout": settings.visibility_timeout}
    transport = {**visibility, **sentinel_options(settings)}
    return {
        "broker_url": broker,
        "result_backend": broker,
        # Redis redelivers an unacked message after the visibility timeout: it must be longer
        # than any step, so a step still running is never delivered twice. The engine bounds
        # every step (NIGHTSHIFT_STEP_TIME_LIMIT, in any pool: pipeline/engine/time_limit.py)
        # and its task returns by then; Celery's hard limit, which only prefork enforces, is a
        # backstop behind it, and a soft limit would raise an Exception that an agent's
        # `except Exception` could swallow.
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        # Through Sentinel over TLS, the servers the sentinels name (sentinel_options speaks
        # TLS to the sentinels themselves): kombu and Celery read no TLS from a sentinel:// URL.
        "broker_use_ssl": settings.broker_sentinel_tls_options,
        "redis_backend_use_ssl": settings.broker_sentinel_tls_options,
        "task_time_limit": settings.step_hard_limit,
        # Task events cost a Redis PUBLISH each (received, started, succeeded, and sent by the
        # sender) on every step, whether anyone listens or not. Flower needs none of them
        # configured: it turns task events on in every worker while it runs (its
        # `enable_events` option, on by default, broadcasts the enable_events control command
        # every few seconds), and then sees steps received, started and succeeded.
        # NIGHTSHIFT_TASK_EVENTS=true sends them always, task-sent included (queued steps
        # visible in Flower).
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        # Workers consume both queues (kombu's Redis transport takes them in turn), so the tick
        # is picked up within a few messages even when thousands of steps are queued.
        "task_default_queue": settings.queue,
        "task_queues": (Queue(settings.queue), Queue(settings.control_queue)),
        "task_routes": {
            "pipeline.tick": {"queue": settings.control_queue},
            "pipeline.fire_schedules": {"queue": settings.control_queue},
            # A completion webhook is small and must not wait behind a night of steps.
            "pipeline.notify": {"queue": settings.control_queue},
            # A bulk operation is a person's request, waiting for its result: not behind steps.
            "pipeline.bulk": {"queue": settings.control_queue},
        },
        "worker_concurrency": settings.worker_concurrency,
        # Re-sends of a step whose pool process died.
        "task_annotations": {"pipeline.step": {"max_retries": settings.worker_lost_max_retries}},
        "beat_schedule": beat_entries(settings),
    }


def sentinel_options(settings: Settings) -> dict[str, Any]:
    """Through Redis Sentinel (a `sentinel://` broker URL), what kombu's transport and Celery's
    result backend need besides the URL: the master's name, and how to speak to the sentinels
    (their own password, TLS). Both ask the sentinels for the master on every new connection,
    so they follow a failover."""
    if not settings.broker_sentinel_master:
        return {}
    options: dict[str, Any] = {"master_name": settings.broker_sentinel_master}
    if settings.broker_sentinel_kwargs:
        options["sentinel_kwargs"] = settings.broker_sentinel_kwargs
    return options


@cache
def _this_process() -> dict[str, Any]:
    return from_settings(get_settings())


def __getattr__(name: str) -> Any:
    """Celery's loader reads this module's attributes (`DictAttribute`) once the app configures
    itself: only then are the settings read (and the embedded services started). Private and
    dunder names are never settings, so looking them up (the import system does) reads
    nothing."""
    if name.startswith("_"):
        raise AttributeError(name)
    try:
        return _this_process()[name]
    except KeyError:
        raise AttributeError(f"module 'celeryconfig' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_this_process()})
