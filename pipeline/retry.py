"""Temporary versus permanent failures, and retries with capped exponential backoff and jitter."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx

from pipeline.errors import PermanentError, TemporaryError, redact_urls
from pipeline.logs import get_logger

T = TypeVar("T")
log = get_logger("nightshift.retry")

TEMPORARY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 529})


def is_temporary_status(status: int) -> bool:
    return status in TEMPORARY_STATUSES


def classify(exc: BaseException) -> TemporaryError | PermanentError:
    """Map an exception from a model or tool call to a temporary or permanent error."""
    if isinstance(exc, TemporaryError | PermanentError):
        return exc
    status = getattr(exc, "status_code", None)
    if status is None and isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
    if isinstance(status, int):
        kind = TemporaryError if is_temporary_status(status) else PermanentError
        return kind(f"HTTP {status}: {_short(exc)}")
    if isinstance(exc, httpx.TimeoutException | httpx.TransportError | TimeoutError | OSError):
        return TemporaryError(f"{type(exc).__name__}: {_short(exc)}")
    name = type(exc).__name__
    if name in ("APITimeoutError", "APIConnectionError"):  # anthropic's transport errors
        return TemporaryError(f"{name}: {_short(exc)}")
    return PermanentError(f"{name}: {_short(exc)}")


def retry_after(exc: BaseException) -> float | None:
    """The seconds a reply asked to wait before the next request, if it said: `retry-after-ms`
    first, then `retry-after` in seconds or as an HTTP date (as the anthropic SDK reads them;
    its exceptions and httpx's carry the response)."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    try:
        return max(0.0, float(headers.get("retry-after-ms")) / 1000)
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        pass
    parsed = email.utils.parsedate_tz(value) if isinstance(value, str) else None
    return None if parsed is None else max(0.0, email.utils.mktime_tz(parsed) - time.time())


def _short(exc: BaseException) -> str:
    """The first line, its URLs without credentials or query strings: it gets journaled."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return redact_urls(text)[:300]


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_seconds: float = 0.5
    cap_seconds: float = 8.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**attempt)]."""
        ceiling = min(self.cap_seconds, self.base_seconds * (2**attempt))
        return (rng or random).uniform(0, ceiling)


def call_with_retries(
    fn: Callable[[], T],
    policy: RetryPolicy = RetryPolicy(),
    *,
    before_retry: Callable[[], None] = lambda: None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call fn; retry temporary errors with backoff; raise the classified error at the end.

    `before_retry` runs before each new attempt, e.g. to stop when the lease is lost.
    """
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:
            error = classify(exc)
            if isinstance(error, PermanentError) or attempt == policy.attempts - 1:
                raise error from exc
            delay = policy.delay(attempt)
            log.warning("temporary error, retry %d in %.2fs: %s", attempt + 1, delay, error)
            sleep(delay)
            before_retry()
    raise AssertionError("unreachable: the loop returns or raises")
