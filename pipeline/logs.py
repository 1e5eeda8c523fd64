"""Log lines that say which run, step, agent and worker they are about.

The engine sets the step's context once; every line logged through `get_logger` while that
step works (engine, tools, actions, retries) carries it, in whatever thread it runs.
`redact_http_logs` gives the HTTP client's own lines the redaction of ours.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
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


class _RedactUrls(logging.Filter):
    """Every URL in a line, its arguments included, without credentials or query string."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_urls(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(
                redact_urls(str(arg)) if "://" in str(arg) else arg for arg in record.args
            )
        return True


HTTP_CLIENT_LOGGERS = ("httpx", "httpcore")


def redact_http_logs() -> None:
    """httpx logs each request's URL at INFO (`HTTP Request: POST http://u:secret@...?key=`),
    for every call a tool, the SDK or a webhook makes: its lines get our redaction."""
    for name in HTTP_CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactUrls) for f in logger.filters):
            logger.addFilter(_RedactUrls())
