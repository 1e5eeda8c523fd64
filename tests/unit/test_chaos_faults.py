"""The chaos harness's faults are one kind a file, found by the registry: adding a fault is
adding a file, and the plan, the CLI's weights and the report learn it from the registry."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import pipeline.chaos.faults as faults_package
from pipeline.chaos.common import ChaosError
from pipeline.chaos.faults import default_weights, discover, parse_weights, registered
from pipeline.chaos.plan import plan_faults

KIND = '''
from pipeline.chaos.faults.base import Draw, FaultKind


class {cls}(FaultKind):
    """A fault in a package of its own."""

    name = "{name}"
    draw_order = {order}
    weight = 1

    def draw(self, rng, lease_seconds):
        return Draw(hold=rng.uniform(1, 2))
'''


def a_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, **kinds: tuple[str, int]
) -> str:
    """A package `name` with a module per kind: module name -> (kind name, draw order)."""
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for module, (kind, order) in kinds.items():
        text = KIND.format(cls=module.title(), name=kind, order=order)
        (package / f"{module}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_every_module_of_the_package_holds_one_kind_named_as_the_module() -> None:
    modules = sorted(
        p.stem for p in Path(faults_package.__file__).parent.glob("*.py")
        if p.stem not in ("__init__", "base")
    )  # fmt: skip

    kinds = registered()

    assert sorted(kinds) == modules
    assert all(type(kind).__module__.rpartition(".")[2] == name for name, kind in kinds.items())


def test_a_fault_added_as_one_file_is_found_with_its_own_draw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a package with one file defining a fault kind
    package = a_package(tmp_path, monkeypatch, "added_faults", flaky=("flaky", 0))

    # when the registry looks in it
    found = discover(package)

    # then the kind is there, drawing its own parameters
    assert list(found) == ["flaky"]
    assert 1 <= found["flaky"].draw(random.Random(1), 3).hold <= 2


def test_two_kinds_with_one_name_or_one_draw_order_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = a_package(tmp_path, monkeypatch, "same_name", a=("same", 0), b=("same", 1))
    ordered = a_package(tmp_path, monkeypatch, "same_order", a=("one", 0), b=("two", 0))

    with pytest.raises(ChaosError, match="two fault kinds are named 'same'"):
        discover(named)
    with pytest.raises(ChaosError, match="two fault kinds share a draw_order"):
        discover(ordered)


def test_the_default_weights_name_every_kind_and_an_unknown_kind_is_refused() -> None:
    weights = parse_weights(default_weights())

    assert list(weights) == list(registered()) and all(w > 0 for w in weights.values())
    with pytest.raises(ChaosError, match="unknown fault kind 'nap'; known: kill, stop, "):
        parse_weights("nap=1")


def test_a_schedule_draws_every_kind_with_its_own_parameters() -> None:
    weights = parse_weights(default_weights())

    plan = plan_faults(seed=5, duration=600, rate=24, weights=weights, lease_seconds=3)

    assert {f.kind for f in plan} == set(registered())
    outages = [f for f in plan if f.kind == "model_outage"]
    assert all(f.mode in ("529", "429") and 10 <= f.hold <= 30 for f in outages)
    kills = [f for f in plan if f.kind == "kill"]
    assert {f.mode for f in kills} == {"worker", "child"}
