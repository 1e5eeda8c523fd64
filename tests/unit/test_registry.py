"""The agent registry: entry points and NIGHTSHIFT_AGENTS, and a one-line error for every
way a registration can be wrong."""

from __future__ import annotations

import importlib
import sys
import tomllib
from importlib.metadata import version as version_of
from pathlib import Path

import pytest

from pipeline.errors import RegistryError, UnknownAgent
from pipeline.registry import _Declared, _declared, build


def declared(*paths: str) -> list[_Declared]:
    return [_Declared(path, "NIGHTSHIFT_AGENTS") for path in paths]


ALL = frozenset({"all"})


def test_the_shipped_agents_come_from_nightshifts_own_entry_points() -> None:
    registry = build(*_declared("", ALL))
    assert {"nightly_report", "patch", "competitor_monitor", "invoice_reminders"} <= set(
        registry.agents
    )
    registered = registry.agents["nightly_report"]
    assert registered.path == "pipeline.agents.nightly_report:AGENT"
    assert "entry point 'nightly_report' of nightshift" in registered.source
    assert registry.event_source("ops-report-request")[0].name == "nightly_report"


def test_the_shipped_agents_are_off_until_named() -> None:
    # by default: none of them, and asking for one says how to turn it on
    off = build(*_declared("", frozenset()))
    assert not {"nightly_report", "patch", "competitor_monitor"} & set(off.agents)
    assert off.event_sources == {}
    with pytest.raises(UnknownAgent) as raised:
        off.agent("nightly_report")
    assert str(raised.value) == (
        "agent 'nightly_report' is one of nightshift's shipped agents, off here: set "
        "NIGHTSHIFT_SHIPPED_AGENTS=nightly_report (or all) where it should run"
    )
    # named: those only
    some = build(*_declared("", frozenset({"competitor_monitor", "price_synthesis"})))
    assert {"competitor_monitor", "price_synthesis"} == set(some.agents)
    # registered by its path, one is on all the same
    by_path = build(*_declared("pipeline.agents.patch:AGENT", frozenset()))
    assert "patch" in by_path.agents and "patch" not in by_path.shipped_off


def test_a_shipped_agent_nightshift_does_not_ship_is_one_line() -> None:
    with pytest.raises(RegistryError) as raised:
        _declared("", frozenset({"nightly_reprot"}))
    text = str(raised.value)
    assert text.startswith(
        "NIGHTSHIFT_SHIPPED_AGENTS names 'nightly_reprot', which nightshift does not ship "
        "(it ships: all, competitor_monitor, follow_up, invoice_reminders, nightly_report, "
    )
    assert "\n" not in text


def test_nightshift_agents_adds_a_module_outside_the_package() -> None:
    registry = build(*_declared(" tests.fixture_agents:ECHO , ", frozenset()))
    assert registry.agent("echo_outside").tools[0].name == "shout"
    assert registry.agents["echo_outside"].source == "NIGHTSHIFT_AGENTS"


def test_the_agent_version_changes_with_what_changes_behaviour_and_only_with_that() -> None:
    def version(path: str, model: str = "script") -> str:
        registered = build(declared(path)).agents["notifier"]
        return registered.version(model)

    first = version("tests.fixture_agents:NOTIFIER")
    release, _, digest = first.partition("+")
    assert release == "unpackaged" and len(digest) == 16  # tests/ is no distribution
    shipped = build(*_declared("", ALL)).agents["nightly_report"].version("script")
    assert shipped.startswith(f"{version_of('nightshift')}+")
    assert version("tests.fixture_agents:NOTIFIER") == first  # the same code, the same version
    assert version("tests.fixture_agents:NOTIFIER", model="claude-x") != first
    changed = [
        "NOTIFIER_REKEYED",  # a key function's code
        "NOTIFIER_NEXT",  # instructions
        "NOTIFIER_RENAMED",  # a tool's name, the system prompt
        "NOTIFIER_STRICTER",  # a tool's schema
        "NOTIFIER_TO_CHAT",  # a side effect's service
    ]
    versions = {version(f"tests.fixture_agents:{name}") for name in changed}
    assert len(versions) == len(changed) and first not in versions


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.no_such_module:AGENT", "no module named 'tests.no_such_module'"),
        ("tests.fixture_agents:MISSING", "module tests.fixture_agents has no attribute 'MISSING'"),
        ("tests.fixture_agents:NOT_AN_AGENT", "is a dict, not a pipeline.Agent"),
        ("tests.fixture_agents", "must look like 'package.module:ATTRIBUTE'"),
    ],
)
def test_a_wrong_registration_is_one_line_naming_it(path: str, message: str) -> None:
    with pytest.raises(RegistryError) as raised:
        build(declared(path))
    text = str(raised.value)
    assert message in text and path in text and "\n" not in text


def test_an_entry_point_whose_module_is_gone_says_to_reinstall_the_package() -> None:
    # an install made before its module moved: its metadata still names the old module
    gone = _Declared("pipeline.agents.moved_away:AGENT", "entry point of x", "moved_away")

    with pytest.raises(RegistryError) as raised:
        build([gone])

    assert str(raised.value).endswith(
        "no module named 'pipeline.agents.moved_away'; reinstall the package"
    )


def test_two_agents_with_one_name_are_refused() -> None:
    with pytest.raises(RegistryError, match="two agents are named 'nightly_report'"):
        build(
            declared("pipeline.agents.nightly_report:AGENT", "tests.fixture_agents:LAZY_AS_REPORT")
        )


def test_an_entry_point_must_be_named_like_its_agent() -> None:
    wrong = _Declared("tests.fixture_agents:ECHO", "entry point 'echo' of somebody", "echo")
    with pytest.raises(RegistryError, match="entry point is named 'echo' but the agent is named"):
        build([wrong])


def test_an_unknown_agent_says_how_to_register_one() -> None:
    registry = build(declared("tests.fixture_agents:ECHO"))
    with pytest.raises(UnknownAgent) as raised:
        registry.agent("nope")
    assert "known agents: echo_outside" in str(raised.value)
    assert "nightshift.agents" in str(raised.value) and "NIGHTSHIFT_AGENTS" in str(raised.value)


def test_the_benchmark_agents_are_no_production_entry_points() -> None:
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    points = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["nightshift.agents"]

    assert not {"bench", "bench_synthesis"} & set(points)
    assert all(path.startswith("pipeline.agents.") for path in points.values())


def test_a_change_to_a_tools_code_alone_is_a_new_version(tmp_path: Path) -> None:
    # given an agent module on disk whose tool's body, and nothing else, a release changes
    module = tmp_path / "code_only_agent.py"
    module.write_text(CODE_ONLY_AGENT.format(answer=1))
    sys.path.insert(0, str(tmp_path))
    try:
        first = build(declared("code_only_agent:AGENT")).agents["code_only"].version("script")
        again = build(declared("code_only_agent:AGENT")).agents["code_only"].version("script")
        module.write_text(CODE_ONLY_AGENT.format(answer=2))
        importlib.reload(importlib.import_module("code_only_agent"))
        changed = build(declared("code_only_agent:AGENT")).agents["code_only"].version("script")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("code_only_agent", None)
    # then the version follows the code, and only the code
    assert first == again and changed != first


CODE_ONLY_AGENT = """
from pipeline import Agent, tool


@tool(description="Counts.", schema={{"type": "object"}})
def count(args, context):
    return {{"n": {answer}}}


AGENT = Agent(
    name="code_only", system="You count.", instructions="Count once.", tools=[count],
    input_schema={{"type": "object"}},
)
"""
