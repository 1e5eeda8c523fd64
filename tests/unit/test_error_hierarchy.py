"""The error hierarchy (pipeline/errors.py) holds for every module: each exception nightshift
defines has one of the two roots, and each error one status, from the API's one table."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pipeline
from pipeline.api.base import _STATUS_FOR, status_for
from pipeline.engine.actions import ParkRun
from pipeline.errors import NightshiftError, StopStep

BASES = tuple(kind for kind, _ in _STATUS_FOR)
EDGES = ("api", "cli", "chaos", "processes", "sandbox", "testing", "agents", "tasks")
"""Where a module may keep an error only it raises (docs/layout.md's layer 5, and the agents)."""


def defined_exceptions() -> list[type[BaseException]]:
    """Every exception class a module of pipeline defines (not one it imports)."""
    found = []
    for module in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
        if module.name.rpartition(".")[2] == "__main__":
            continue  # a program: importing it runs it
        loaded = importlib.import_module(module.name)
        for _, value in inspect.getmembers(loaded, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.name:
                found.append(value)
    return found


def test_every_exception_nightshift_defines_has_one_of_the_two_roots() -> None:
    exceptions = defined_exceptions()
    assert len(exceptions) > 40
    strays = [
        f"{kind.__module__}.{kind.__qualname__}"
        for kind in exceptions
        if not issubclass(kind, (NightshiftError, StopStep))
    ]
    assert strays == [], f"derive these from a base in pipeline/errors.py: {strays}"


def test_the_runtime_defines_its_errors_in_errors_py_and_the_edges_keep_only_their_own() -> None:
    elsewhere = [
        f"{kind.__module__}.{kind.__qualname__}"
        for kind in defined_exceptions()
        if kind.__module__ != "pipeline.errors"
        and kind.__module__.split(".")[1] not in EDGES
        and kind is not ParkRun  # it carries a Wait of pipeline.keys, a layer above errors
    ]
    assert elsewhere == [], f"move these to pipeline/errors.py: {elsewhere}"


def test_every_error_maps_to_exactly_one_status_through_its_base() -> None:
    for kind in defined_exceptions():
        if not issubclass(kind, NightshiftError) or kind is NightshiftError:
            continue
        matched = [base for base in BASES if issubclass(kind, base)]
        # A refinement (TooLarge of Invalid) is one status with the base it refines.
        most_specific = [
            base
            for base in matched
            if not any(o is not base and issubclass(o, base) for o in matched)
        ]
        assert len(most_specific) == 1, f"{kind.__qualname__} derives from {most_specific}"
        statuses = {status for base, status in _STATUS_FOR if base is most_specific[0]}
        assert len(statuses) == 1


def test_a_refinement_comes_before_the_base_it_refines() -> None:
    # status_for takes the first base that matches: a refinement listed after its base would
    # never be reached
    for position, (base, _) in enumerate(_STATUS_FOR):
        earlier = [kind for kind, _ in _STATUS_FOR[:position]]
        assert not any(issubclass(base, kind) for kind in earlier), base
    for base, status in _STATUS_FOR:
        assert status_for(base("x")) == status
