"""Log lines that say which run, step, agent and worker they are about.

The engine sets the step's context once; every line logged through `get_logger` while that
step works (engine, tools, actions, retries) carries it, in whatever thread it runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_step: ContextVar[str] = ContextVar("nightshift_step", default="")


@contextmanager
def step_context(run_id: object, agent: str, step: int, worker: str) -> Iterator[None]:
    token = _step.set(f"run={run_id} step={step} agent={agent} worker={worker}")
    try:
        yield
    finally:
        _step.reset(token)


class _StepAdapter(logging.LoggerAdapter):  # type: ignore[type-arg,unused-ignore]
    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        context = _step.get()
        return (f"[{context}] {msg}" if context else msg), kwargs


def get_logger(name: str) -> logging.LoggerAdapter:  # type: ignore[type-arg,unused-ignore]
    return _StepAdapter(logging.getLogger(name), {})
