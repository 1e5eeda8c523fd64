"""What the chaos harness's parts share: its errors, and retrying a call while PostgreSQL or
Redis is briefly away."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import redis
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import DBAPIError

from pipeline.errors import Failed

T = TypeVar("T")


# The chaos harness's own errors (it raises and catches them), so they stay in the harness.
class ChaosError(Failed):
    """The chaos harness could not do what it was asked."""


class NoTarget(ChaosError):
    """Nothing to inject this fault into right now (no busy worker, no pending approval)."""


class WebhookUnavailable(ChaosError):
    """The API did not answer, or answered that it could not (5xx): try again later."""


TRANSIENT = (DBAPIError, psycopg.Error, BrokerError, redis.RedisError, OSError, WebhookUnavailable)
"""What a service restart makes the harness's own calls (and the API's answers) raise for a
moment."""


def retrying(
    call: Callable[[], T], timeout: float = 60.0, errors: tuple[type[Exception], ...] = TRANSIENT
) -> T:
    """`call()`, tried again while PostgreSQL or Redis is briefly away."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except errors:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)
