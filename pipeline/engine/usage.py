"""What a step's model calls used and cost, added to the run's counters when the step commits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.prices import PriceTable

SCRIPTED_MODEL = "scripted"
"""The model name of an agent's own script (no API key): its tokens are estimates and it
costs nothing, so it never spends a money budget."""

COUNTERS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)
"""The Messages API's usage fields; input_tokens excludes what was written to or read from
the prompt cache."""

USAGE_COLUMNS = (*COUNTERS, "cost_usd")
"""The run's columns a step's usage is added to (Usage.amounts() names them the same)."""


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    cost_usd: float = 0.0
    """Priced for the model that answered, as the price table says now."""

    @classmethod
    def of(cls, reply: dict[str, Any], prices: PriceTable) -> Usage:
        """One reply's usage and cost (a reply without usage, e.g. compacted, counts zero)."""
        usage = reply.get("usage") or {}
        return cls(
            input_tokens=_count(usage.get("input_tokens")),
            output_tokens=_count(usage.get("output_tokens")),
            cache_creation_input_tokens=_count(usage.get("cache_creation_input_tokens")),
            cache_read_input_tokens=_count(usage.get("cache_read_input_tokens")),
            cost_usd=0.0
            if reply.get("model") == SCRIPTED_MODEL
            else prices.price_for(reply.get("model")).cost_usd(usage),
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_creation_input_tokens + other.cache_creation_input_tokens,
            self.cache_read_input_tokens + other.cache_read_input_tokens,
            self.cost_usd + other.cost_usd,
        )

    def amounts(self) -> dict[str, Any]:
        """This usage by counter name: what a step's UPDATE adds to the run's columns."""
        return {name: getattr(self, name) for name in USAGE_COLUMNS}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
