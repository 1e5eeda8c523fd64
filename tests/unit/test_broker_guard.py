"""A Redis channel whose connection was collected fails like a lost connection, not a crash.

The consumer collects its broker connection when it breaks; whatever then still uses a channel
of it (the second close, a step's late ack) must see a ConnectionError, which the worker
handles, and not the AttributeError that made it exit (see
pipeline.celery_patches.install_broker_guard).
"""

from __future__ import annotations

import logging
import os
import uuid

import pytest
import redis.exceptions
from kombu import Connection, Queue
from kombu.transport import redis as kombu_redis

import pipeline.app  # noqa: F401  (installs the guard, as the worker does)
from pipeline.celery_patches import install_broker_guard


def test_installing_twice_patches_once() -> None:
    before = kombu_redis.Channel._connparams
    install_broker_guard()
    assert kombu_redis.Channel._connparams is before


def test_a_channel_left_open_by_a_broken_collect_fails_as_a_connection_error(caplog) -> None:
    url = os.environ["NIGHTSHIFT_BROKER_URL"]
    queue = Queue(f"guard-test-{uuid.uuid4().hex}")
    with Connection(url) as conn:
        conn.Producer().publish({"n": 1}, routing_key=queue.name, declare=[queue])
        received = []
        with conn.Consumer(queue, callbacks=[lambda body, m: received.append(m)]):
            conn.drain_events(timeout=5)
        (message,) = received
        channel = conn.default_channel
        # What collect() leaves when the broker died under a BRPOP: the task channel's close
        # stopped early (still open, the message still unacked), the transport detached.
        channel.connection.client = None
        try:
            # The consumer's second close gives the unacked message back first...
            with pytest.raises(redis.exceptions.ConnectionError):
                channel.close()
            # ...and a step that was running acknowledges on the same channel later.
            with caplog.at_level(logging.CRITICAL):
                message.ack_log_error(logging.getLogger("test"), conn.connection_errors)
            assert "Couldn't ack" in caplog.text
        finally:
            client = redis.Redis.from_url(url)
            client.delete(queue.name)
            client.hdel("unacked", message.delivery_tag)
            client.zrem("unacked_index", message.delivery_tag)
