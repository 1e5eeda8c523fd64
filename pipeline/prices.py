"""Model prices (NIGHTSHIFT_MODEL_PRICES and the per-token defaults): what a reply costs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.errors import SettingsError

PRICE_FIELDS = ("input", "output", "cache_write", "cache_read")


@dataclass(frozen=True)
class ModelPrice:
    """US dollars per million tokens."""

    input: float
    output: float
    cache_write: float
    """Tokens written to the prompt cache (5-minute entries; the API charges 1.25x input)."""
    cache_read: float
    """Tokens read from the prompt cache (the API charges 0.1x input)."""

    @classmethod
    def from_input_output(
        cls,
        input: float,
        output: float,
        cache_write: float | None = None,
        cache_read: float | None = None,
    ) -> ModelPrice:
        """Cache prices not given are the Messages API's multipliers of the input price."""
        return cls(
            input,
            output,
            cache_write=input * 1.25 if cache_write is None else cache_write,
            cache_read=input * 0.1 if cache_read is None else cache_read,
        )

    def cost_usd(self, usage: Mapping[str, Any]) -> float:
        """The cost of one reply's `usage` (the API's field names; input excludes the cache)."""
        return (
            _count(usage, "input_tokens") * self.input
            + _count(usage, "output_tokens") * self.output
            + _count(usage, "cache_creation_input_tokens") * self.cache_write
            + _count(usage, "cache_read_input_tokens") * self.cache_read
        ) / 1_000_000


def _count(usage: Mapping[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class PriceTable:
    """Prices by model name; a reply's model (`claude-sonnet-4-5-20250929`) takes the price of
    the longest configured name it starts with, else the default."""

    default: ModelPrice
    by_model: tuple[tuple[str, ModelPrice], ...] = ()

    def price_for(self, model: str | None) -> ModelPrice:
        matches = [(n, p) for n, p in self.by_model if model and model.startswith(n)]
        return max(matches, key=lambda match: len(match[0]))[1] if matches else self.default


def parse_model_prices(name: str, raw: str) -> tuple[tuple[str, ModelPrice], ...]:
    """`{"claude-haiku-4-5": {"input": 1, "output": 5, "cache_write": 1.25, "cache_read": 0.1}}`;
    cache_write and cache_read default to the API's multipliers of input."""
    return tuple((model, _price(name, model, entry)) for model, entry in per_model(name, raw))


def per_model(name: str, raw: str, what: str = "model prices") -> list[tuple[str, object]]:
    """A setting's JSON object keyed by model name, as (model, entry) pairs."""
    try:
        table = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name} must be a JSON object of {what} ({exc})") from None
    if not isinstance(table, dict):
        raise SettingsError(f"{name} must be a JSON object keyed by model name")
    return list(table.items())


def _price(name: str, model: str, entry: object) -> ModelPrice:
    if not isinstance(entry, dict) or not {"input", "output"} <= entry.keys():
        raise SettingsError(f"{name}: {model!r} needs at least 'input' and 'output' prices")
    unknown = sorted(entry.keys() - set(PRICE_FIELDS))
    if unknown:
        raise SettingsError(f"{name}: {model!r} has unknown price field {unknown[0]!r}")
    for price_field, value in entry.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise SettingsError(f"{name}: {model!r} {price_field} must be a non-negative number")
    write, read = entry.get("cache_write"), entry.get("cache_read")
    return ModelPrice.from_input_output(
        float(entry["input"]),
        float(entry["output"]),
        None if write is None else float(write),
        None if read is None else float(read),
    )
