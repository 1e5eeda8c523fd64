"""A send whose service answers that it already had the key (Stripe's `Idempotent-Replayed:
true`, a 409 on the key): the tool's send says so with `service_replayed()`, and the action
protocol records the action as a duplicate the service absorbed (resolution
`replayed_by_service`, counted in nightshift_duplicates_absorbed_total). Only the receiving
service sees a duplicate; this is how the run's record and /metrics learn of one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_REPLAYED: ContextVar[list[bool] | None] = ContextVar("nightshift_send_replayed", default=None)


@contextmanager
def watching_replays() -> Iterator[list[bool]]:
    """Around one send: the list is non-empty once the send called `service_replayed()`."""
    said: list[bool] = []
    token = _REPLAYED.set(said)
    try:
        yield said
    finally:
        _REPLAYED.reset(token)


def service_replayed() -> None:
    """Call from a side effect's send when the service answered that it already had the key
    (its reply is the first send's). Outside a send (a read-only tool, a test) it does nothing."""
    said = _REPLAYED.get()
    if said is not None:
        said.append(True)
