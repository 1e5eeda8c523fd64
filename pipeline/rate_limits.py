"""A model provider's limits per model (NIGHTSHIFT_MODEL_RATE_LIMITS): requests, input tokens and
output tokens per minute, which every worker paces its model calls under together
(pipeline/engine/gate.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.errors import SettingsError
from pipeline.prices import per_model

LIMIT_FIELDS = ("requests_per_minute", "input_tokens_per_minute", "output_tokens_per_minute")


@dataclass(frozen=True)
class RateLimit:
    """One model's limits; None: not limited that way."""

    requests_per_minute: float | None = None
    input_tokens_per_minute: float | None = None
    output_tokens_per_minute: float | None = None


def parse_rate_limits(name: str, raw: str) -> tuple[tuple[str, RateLimit], ...]:
    """`{"claude-sonnet-4-5": {"requests_per_minute": 50, "input_tokens_per_minute": 30000,
    "output_tokens_per_minute": 8000}}`; a limit left out is not enforced."""
    if not raw.strip():
        return ()
    entries = per_model(name, raw, "per-model limits")
    return tuple((model, _limit(name, model, entry)) for model, entry in entries)


def _limit(name: str, model: str, entry: object) -> RateLimit:
    if not isinstance(entry, dict) or not entry:
        raise SettingsError(f"{name}: {model!r} needs at least one of {', '.join(LIMIT_FIELDS)}")
    unknown = sorted(entry.keys() - set(LIMIT_FIELDS))
    if unknown:
        raise SettingsError(f"{name}: {model!r} has unknown limit {unknown[0]!r}")
    for limit, value in entry.items():
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value <= 0):  # fmt: skip
            raise SettingsError(f"{name}: {model!r} {limit} must be a positive number")
    return RateLimit(**{limit: float(value) for limit, value in entry.items()})
