"""`once(key, fn)`: one value per key and run, fixed once it is journaled, which every replay
gets back (not at most one call of `fn`: see its docstring); the engine sets where results are
kept (engine/once_journal.py) with `once_scope`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol, TypeVar

from pipeline.errors import OnceOutsideStep

T = TypeVar("T")


class OnceStore(Protocol):
    """Where `once` keeps results: the running step's journal (set by the engine)."""

    def once(self, key: str, fn: Callable[[], T]) -> T: ...


_ONCE: ContextVar[OnceStore | None] = ContextVar("nightshift_once", default=None)


def once(key: str, fn: Callable[[], T]) -> T:
    """Return `fn()`'s result for `key` in this run, fixed once it is journaled: every later
    call with the key (including the replay of a step after a crash, on any worker) returns
    the journaled result without calling `fn`.

    Until the result is journaled, `fn` may run again: a worker that dies after `fn` returned
    and before the journal write committed leaves no trace of it, and the replay calls `fn`
    anew. Nothing saw the lost result (the tool gets it only after the commit), so the run
    sees one value per key; whatever else `fn` did happened twice. Use it for a value a replay
    must not change (a timestamp, a random choice, a decision, a number where a gap is
    acceptable), never to make an effect on the world happen once: that is a side-effecting
    tool's job (the action protocol). The result must be JSON (it is kept in the run's
    journal) and comes back as JSON would (tuples as lists).
    """
    store = _ONCE.get()
    if store is None:
        raise OnceOutsideStep()
    return store.once(key, fn)


@contextmanager
def once_scope(store: OnceStore | None) -> Iterator[None]:
    """While a tool runs: where its `once` calls keep their results (None: refused)."""
    token = _ONCE.set(store)
    try:
        yield
    finally:
        _ONCE.reset(token)
