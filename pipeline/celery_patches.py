"""What nightshift changes in kombu and Celery themselves, each for a failure a test shows: a
worker stays alive across a Redis restart, a channel keeps one Redis client for its publishes,
a lost ack is one warning, a second Ctrl-C ends a threads worker at once, and a dead prefork
pool child is noticed at once (pipeline/prefork.py). `install_patches` installs them all;
pipeline/app.py calls it before any broker connection exists."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import redis.exceptions
from celery import platforms
from celery.concurrency.base import BasePool
from celery.signals import worker_init, worker_ready, worker_shutting_down
from kombu.transport import redis as kombu_redis

from pipeline.prefork import reap_dead_children_promptly
from pipeline.reachability import BROKER

log = logging.getLogger("nightshift.worker")

_MARK = "_nightshift_detached_guard"


def install_patches() -> None:
    """Patch kombu's Redis channel, and have every worker install the rest when it starts.
    Calling it again does nothing."""
    install_broker_guard()
    keep_publish_clients()
    # A dispatch_uid connects each hook once, however often this runs.
    worker_init.connect(_quiet_lost_acks, dispatch_uid="nightshift.quiet_lost_acks")
    worker_init.connect(_reap_promptly, dispatch_uid="nightshift.reap_promptly")
    worker_ready.connect(_note_pool, dispatch_uid="nightshift.note_pool")
    worker_shutting_down.connect(_second_ctrl_c_exits, dispatch_uid="nightshift.second_ctrl_c")


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


def _quiet_lost_acks(**_: Any) -> None:
    logger = logging.getLogger("celery.worker.request")
    if not any(isinstance(f, _LostAck) for f in logger.filters):
        logger.addFilter(_LostAck())


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


def _note_pool(sender: Any, **_: Any) -> None:
    pool = getattr(sender, "pool", None)
    _cannot_cancel_steps[:] = [
        pool is not None and type(pool).terminate_job is BasePool.terminate_job
    ]


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
