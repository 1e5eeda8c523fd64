"""Celery settings for nightshift, all derived from pipeline.settings (the environment).

Why each reliability setting is what it is: ../DESIGN.md, "Celery settings that matter".
"""

from __future__ import annotations

from kombu import Queue

from beat_schedule import beat_schedule
from pipeline.db import broker_url as _broker_url
from pipeline.settings import get_settings

_settings = get_settings()

broker_url = _broker_url(_settings)
# .delay() callers in other services read the run id from the result; results expire in a day.
# Only those entry points keep one: steps, the tick and the schedule check store nothing.
result_backend = broker_url
result_expires = 24 * 3600
broker_connection_retry_on_startup = True

# A step is acknowledged only after it ran, so a dead worker's message is delivered again.
task_acks_late = True
worker_prefetch_multiplier = 1
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
result_accept_content = ["json"]

# Redis redelivers an unacked message after the visibility timeout: it must be longer than any
# step, so a step still running is never delivered twice. The engine bounds every step
# (NIGHTSHIFT_STEP_TIME_LIMIT, in any pool: pipeline/engine/time_limit.py) and its task returns
# by then; Celery's hard limit, which only prefork enforces, is a backstop behind it, and a soft
# limit would raise an Exception that an agent's `except Exception` could swallow.
broker_transport_options = {"visibility_timeout": _settings.visibility_timeout}
result_backend_transport_options = {"visibility_timeout": _settings.visibility_timeout}
task_time_limit = _settings.step_hard_limit

# A pool child that dies is retried a bounded number of times (reject_on_worker_lost loops forever).
task_retry_on_worker_lost = True
# A step running when the broker connection drops finishes; it is not killed. Its ack cannot
# reach the new connection, so Redis hands the message out again after the visibility timeout,
# and the step's Postgres lease refuses that duplicate. Cancelling cannot stop a thread anyway
# (the threads pool has no terminate), and on prefork it would throw away the step's work.
# Celery 6 turns this on by default, hence explicit. The Redis-restart crash itself is handled
# by pipeline.app.install_broker_guard.
worker_cancel_long_running_tasks_on_connection_loss = False

# Task events cost a Redis PUBLISH each (received, started, succeeded, and sent by the sender)
# on every step, whether anyone listens or not. Flower needs none of them configured: it turns
# task events on in every worker while it runs (its `enable_events` option, on by default,
# broadcasts the enable_events control command every few seconds), and then sees steps
# received, started and succeeded. NIGHTSHIFT_TASK_EVENTS=true sends them always, task-sent
# included (queued steps visible in Flower). No started state is stored: steps keep no result.
worker_send_task_events = _settings.task_events
task_send_sent_event = _settings.task_events
task_track_started = False

# Workers consume both queues (kombu's Redis transport takes them in turn), so the tick is
# picked up within a few messages even when thousands of steps are queued.
task_default_queue = _settings.queue
task_queues = (Queue(_settings.queue), Queue(_settings.control_queue))
task_routes = {
    "pipeline.tick": {"queue": _settings.control_queue},
    "pipeline.fire_schedules": {"queue": _settings.control_queue},
    # A completion webhook is small and must not wait behind a night of steps.
    "pipeline.notify": {"queue": _settings.control_queue},
}

timezone = "UTC"
enable_utc = True

# Steps mostly wait on the network: threads keep many in flight per process.
worker_pool = "threads"
worker_concurrency = _settings.worker_concurrency
worker_hijack_root_logger = False

beat_schedule = beat_schedule
