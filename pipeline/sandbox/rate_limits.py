"""The Messages API sandbox's rate limits: requests, input tokens and output tokens per minute,
as the provider enforces them (a bucket per limit that refills continuously up to one minute's
worth; a request the buckets cannot pay for is answered 429 with `retry-after`).

Input tokens are charged when the request arrives (its whole prompt, as the sandbox counts it);
output tokens once the reply is made. A request is refused while a bucket is short of what it
needs: one request, its input, and any output at all (the output a reply will cost is not known
before it is written, so an output bucket in debt refuses, as the real API's estimate does).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LIMITS = ("requests_per_minute", "input_tokens_per_minute", "output_tokens_per_minute")


@dataclass
class _Bucket:
    per_minute: float
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        rate = self.per_minute / 60.0
        self.level = min(self.capacity, self.level + (now - self.at) * rate)
        self.at = now

    def seconds_until(self, amount: float) -> float:
        """How long until the bucket holds `amount` (0: it does now)."""
        short = amount - self.level
        return 0.0 if short <= 0 else short * 60.0 / self.per_minute


class RateLimits:
    """The limits in force (none at first). Thread-safe: the sandbox answers on many threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()
        self.refused = 0
        """Requests answered 429 for a limit (not for an injected fault or an outage)."""

    def set(self, burst_seconds: float = 60.0, **per_minute: float | None) -> dict[str, float]:
        """Put limits in force (a name missing or None lifts that limit); buckets start full.
        A bucket holds `burst_seconds` of its limit (the API's: a minute; less, a provider that
        enforces "60 a minute" as one a second)."""
        if (
            isinstance(burst_seconds, bool)
            or not isinstance(burst_seconds, int | float)
            or not (0 < burst_seconds <= 60)
        ):
            raise ValueError(
                f"burst_seconds must be a number of seconds in (0, 60] (got {burst_seconds!r})"
            )
        unknown = set(per_minute) - set(LIMITS)
        if unknown:
            known = ", ".join(LIMITS)
            raise ValueError(f"unknown rate limit {sorted(unknown)[0]!r}; known: {known}")
        for name, value in per_minute.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value) or value <= 0):  # fmt: skip
                raise ValueError(f"{name} must be a positive number (got {value!r})")
        now = self._clock()
        with self._lock:
            self._buckets = {
                name: _Bucket(
                    float(value), value * burst_seconds / 60, value * burst_seconds / 60, now
                )
                for name, value in per_minute.items()
                if value is not None
            }
            self.refused = 0
            return self.shown()

    def shown(self) -> dict[str, float]:
        return {name: bucket.per_minute for name, bucket in self._buckets.items()}

    def admit(self, input_tokens: int) -> tuple[str, float] | None:
        """Charge one request and its input and return None; or, when a bucket is short,
        charge nothing and return that limit and how long until it would pay."""
        now = self._clock()
        needs = {"requests_per_minute": 1.0, "input_tokens_per_minute": float(input_tokens),
                 "output_tokens_per_minute": 1.0}  # fmt: skip
        with self._lock:
            wait, short = 0.0, ""
            for name, bucket in self._buckets.items():
                bucket.refill(now)
                # A request larger than a full bucket waits for a full bucket.
                seconds = bucket.seconds_until(min(needs[name], bucket.capacity))
                if seconds > wait:
                    wait, short = seconds, name
            if wait > 0:
                self.refused += 1
                return short, wait
            for name, bucket in self._buckets.items():
                if name != "output_tokens_per_minute":
                    bucket.level -= needs[name]
            return None

    def charge_output(self, output_tokens: int) -> None:
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get("output_tokens_per_minute")
            if bucket is not None:
                bucket.refill(now)
                bucket.level -= output_tokens

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"rate_limits": self.shown(), "rate_limited": self.refused}
