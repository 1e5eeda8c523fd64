"""A value a process loads once and every thread of it shares (its settings, its agents, where
its step messages go), which a block may replace: how `pipeline.testing` runs the real step
with a test's settings, the test's agent and an in-process hand-off instead of the broker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class ProcessWide(Generic[T]):
    """`value()`: the replacement in force, else what `load` returned on first use (kept until
    `cache_clear()`). `with value.replaced_by(other):` puts `other` in force for every thread of
    the process until the block ends; blocks nest, the innermost wins."""

    def __init__(self, load: Callable[[], T]) -> None:
        self._load = load
        self._loaded: list[T] = []
        self._replacements: list[T] = []

    def __call__(self) -> T:
        if self._replacements:
            return self._replacements[-1]
        if not self._loaded:  # two threads may both load at first: the first kept wins
            value = self._load()
            if not self._loaded:
                self._loaded.append(value)
        return self._loaded[0]

    @property
    def loaded(self) -> bool:
        """Whether `load` has run (and its value is kept)."""
        return bool(self._loaded)

    def cache_clear(self) -> None:
        """Load again at the next use (a replacement in force stays in force)."""
        self._loaded.clear()

    @contextmanager
    def replaced_by(self, value: T) -> Iterator[T]:
        self._replacements.append(value)
        try:
            yield value
        finally:
            # This block's own entry, should another block have ended out of order.
            index = max(i for i, v in enumerate(self._replacements) if v is value)
            del self._replacements[index]
