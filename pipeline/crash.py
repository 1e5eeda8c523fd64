"""Named crash points for tests and chaos runs: the worker process dies abruptly right there,
or (a pause point) stops itself there until a test sends it SIGCONT.

Enabled only through NIGHTSHIFT_CRASH_POINTS and NIGHTSHIFT_PAUSE_POINTS (comma-separated
names); both empty in production.
"""

from __future__ import annotations

import os
import signal
import threading

from pipeline.logs import get_logger
from pipeline.settings import get_settings

# Within a step, each line names the run and step it stopped (logs.step_context).
log = get_logger("nightshift.crash")

POINTS = frozenset(
    {
        "after_intended",
        "after_attempted",
        "after_send_before_reply",
        "after_confirmed",
        "after_model_journaled",
        "after_cut_off_journaled",
        "after_tool_journaled",
        "before_artifact_committed",
        "after_once_ran",
        "after_once_committed",
        "before_checkpoint",
        "after_checkpoint_before_enqueue",
        "after_notify_sent",
        "before_park",
        "before_batch_join",
        "between_publish_chunks",
    }
)


def crash_point(name: str) -> None:
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name!r}")
    if name in get_settings().crash_points:
        log.warning("crash point %s: killing pid %d", name, os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
    if name in get_settings().pause_points:
        log.warning("pause point %s: stopping pid %d until SIGCONT", name, os.getpid())
        # To this thread, not the process: a process-directed SIGSTOP is taken by another
        # thread (the main one, asleep in Celery's poll), and until that thread is scheduled
        # and stops the rest, this one runs on past its pause point, into the step's next
        # transaction (its fence guard), which PostgreSQL then ends as idle in transaction.
        # Taken by the thread it was sent to, it stops that thread before pthread_kill returns.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
