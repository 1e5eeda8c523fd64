"""The chaos harness's faults: one kind a module in this package (a `FaultKind` subclass with a
`name`, pipeline/chaos/faults/base.py), found by looking, so adding a fault is adding a file."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from pipeline.chaos.common import ChaosError
from pipeline.chaos.faults.base import Fault, FaultKind


@cache
def registered() -> dict[str, FaultKind]:
    """Every fault kind of this package by name, in draw order (imported on first use)."""
    return discover(__name__)


def discover(package: str) -> dict[str, FaultKind]:
    """The fault kinds defined in `package`'s modules, by name, in draw order."""
    found: dict[str, FaultKind] = {}
    for module_info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        module = importlib.import_module(f"{package}.{module_info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, FaultKind)
                and value.__module__ == module.__name__
                and value.name
            ):
                if value.name in found:
                    raise ChaosError(f"two fault kinds are named {value.name!r}")
                found[value.name] = value()
    orders = sorted(kind.draw_order for kind in found.values())
    if len(set(orders)) != len(orders):
        raise ChaosError(f"two fault kinds share a draw_order: {orders}")
    return dict(sorted(found.items(), key=lambda item: item[1].draw_order))


def kind_names() -> tuple[str, ...]:
    return tuple(registered())


def fault_kind(name: str) -> FaultKind:
    try:
        return registered()[name]
    except KeyError:
        raise ChaosError(f"unknown fault kind {name!r}; known: {', '.join(registered())}") from None


def default_weights() -> str:
    """`--faults`' default: every kind at its own weight."""
    return ",".join(f"{name}={kind.weight:g}" for name, kind in registered().items())


def parse_weights(text: str) -> dict[str, float]:
    """`kill=3,stop=2` -> {"kill": 3.0, "stop": 2.0, others: 0}."""
    weights = dict.fromkeys(registered(), 0.0)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        fault_kind(name)
        try:
            weights[name] = float(value)
        except ValueError:
            raise ChaosError(f"fault weight for {name} must be a number (got {value!r})") from None
        if weights[name] < 0:
            raise ChaosError(f"fault weight for {name} must not be negative")
    if not any(weights.values()):
        raise ChaosError("at least one fault kind needs a positive weight")
    return weights


def describe(fault: Fault) -> str:
    """One line for a planned fault: its number, time, kind and parameters."""
    return fault_kind(fault.kind).describe(fault)


__all__ = [
    "Fault",
    "FaultKind",
    "default_weights",
    "describe",
    "discover",
    "fault_kind",
    "kind_names",
    "parse_weights",
    "registered",
]
