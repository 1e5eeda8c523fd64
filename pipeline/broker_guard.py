"""Keep a worker alive when its Redis broker restarts (kombu 5.7's Redis transport).

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

from __future__ import annotations

from typing import Any

import redis.exceptions
from kombu.transport import redis as kombu_redis

_MARK = "_nightshift_detached_guard"


def install() -> None:
    """Patch kombu's Redis channel once; calling it again does nothing."""
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
