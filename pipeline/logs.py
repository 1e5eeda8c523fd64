"""Log lines that say which run, step, agent and worker they are about, each one line with
no secret in its URLs.

The engine sets the step's context once; every line logged through `get_logger` while that
step works (engine, tools, actions, retries) carries it, in whatever thread it runs.
`safe_log_lines` makes every line of a process one line, whatever text it quotes, and redacts
the URLs it names.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from pipeline.errors import redact_urls

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


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Characters that break a line or steer a terminal: C0 and C1 controls (newline, carriage
return, escape, NEL) and the Unicode line and paragraph separators."""


def one_line(text: str) -> str:
    """`text` with each control character written as its escape (`\\n`, `\\x1b`, `\\u2028`)."""
    return _CONTROL.sub(lambda found: found.group().encode("unicode_escape").decode(), text)


class _SafeRecord(logging.LogRecord):
    """A log record whose message is one line with every URL redacted, however it was built:
    a newline from an input, a model's text or a header (`batch` = "x\\nINFO ... approve by")
    cannot forge a line of its own, and a URL's credentials, query string and token-like path
    segments (a hook's secret) stay out of the log. A traceback (exc_info) is left as it is."""

    def getMessage(self) -> str:
        message = super().getMessage()
        if "://" in message:
            message = redact_urls(message)
        return one_line(message)


class _SafeRecords:
    """A log record factory: whatever the factory before it makes, as a `_SafeRecord`."""

    def __init__(self, factory: Callable[..., logging.LogRecord]) -> None:
        self.factory = factory

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.factory(*args, **kwargs)
        if type(record) is logging.LogRecord:  # another factory's subclass keeps its class
            record.__class__ = _SafeRecord
        return record


def safe_log_lines() -> None:
    """Make every log record of this process a `_SafeRecord`, whoever logs it (our lines,
    Celery's, uvicorn's, httpx's `HTTP Request: POST <url>`). Called when a process starts to
    serve (worker and beat, the API app, the CLI), never on import; a second call does
    nothing."""
    factory = logging.getLogRecordFactory()
    if not isinstance(factory, _SafeRecords):
        logging.setLogRecordFactory(_SafeRecords(factory))
