"""A release that changes only a tool's code is a new agent version: a run its old code
started meets the agent's on_version_change policy on a worker running the new code; under
`continue`, a replayed call the new code would not make (a once() of another key) parks the
run before anything is computed again, and one it would make replays as recorded."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from models import RunStatus
from pipeline.runs.decisions import Actor
from pipeline.runs.start import start_run
from pipeline.runs.versions import allow_version
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import run_row, tool_results_of, wait_for, wait_for_status

AGENT_MODULE = """
from pipeline import Agent, text, tool, tool_use


@tool(description="Counts the team's open incidents (local, read-only).",
      schema={{"type": "object"}})
def count_incidents(args, context):
    return {{"open": {answer}}}


def _count_then_answer(conversation):
    if not conversation.tool_results():
        return [tool_use(0, 0, "count_incidents", {{}})]
    return [text(f"counted: {{conversation.tool_results()[0]['content']}}")]


AGENT = Agent(
    name="incident_counter", system="You count incidents.", instructions="Count them once.",
    tools=[count_incidents], input_schema={{"type": "object"}}, script=_count_then_answer,
    on_version_change="park",
)
"""


@pytest.fixture
def releases(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[int], str]]:
    """release(n): a directory holding the agent's module as release n writes it, where only
    count_incidents' answer differs; the old release's is importable in this process."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    get_settings.cache_clear()

    def release(answer: int) -> str:
        directory = tmp_path / f"release-{answer}"
        directory.mkdir()
        (directory / "incident_counter_agent.py").write_text(AGENT_MODULE.format(answer=answer))
        return str(directory)

    yield release
    sys.modules.pop("incident_counter_agent", None)


def test_a_tool_code_only_change_meets_the_agents_version_policy(
    releases: Callable[[int], str],
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a run of the old release whose worker died right after journaling the tool call
    old, new = releases(1), releases(2)
    path = os.environ["PYTHONPATH"]
    monkeypatch.syspath_prepend(old)
    register_agents("incident_counter_agent:AGENT")
    agents = os.environ["NIGHTSHIFT_AGENTS"]
    processes("beat", beat=True)  # its tick hands the dead worker's run on
    doomed = processes("old", env={
        "PYTHONPATH": f"{old}{os.pathsep}{path}", "NIGHTSHIFT_AGENTS": agents,
        "NIGHTSHIFT_CRASH_POINTS": "after_model_journaled",
    })  # fmt: skip
    run_id = start_run("incident_counter", {}).run_id
    wait_for(doomed.exited, timeout=60, what="the old release's worker to die")
    started = run_row(run_id).agent_version

    # when a worker of the release whose tool code alone changed takes the run over
    processes("new", env={"PYTHONPATH": f"{new}{os.pathsep}{path}", "NIGHTSHIFT_AGENTS": agents})
    row = wait_for_status(run_id, {s.value for s in RunStatus if s.value != "running"}, timeout=60)

    # then the run waits for a person under the agent's `park` policy, naming both versions
    assert (row.status, row.stop_reason) == (RunStatus.NEEDS_ATTENTION, "version_changed"), row
    wait, _, version = row.waiting_on.partition(":")
    assert wait == "version" and version != started and started in row.error


NUMBERING_MODULE = """
from pathlib import Path

from pipeline import Agent, once, text, tool, tool_use


def _allocate(context):
    log = Path(context.config("numbers.log"))
    with log.open("a") as handle:
        handle.write("allocated\\n")
    return 1000 + len(log.read_text().splitlines())


@tool(description="Gives acme's invoice a number of its own (local).",
      schema={{"type": "object"}})
def number_invoice(args, context):
    number = once({key!r}, lambda: _allocate(context)) if {key!r} else 7
    return {{"number": number, "label": {label!r}}}


def _number_then_answer(conversation):
    if not conversation.tool_results():
        return [tool_use(0, 0, "number_invoice", {{}})]
    return [text(f"numbered: {{conversation.tool_results()[0]['content']}}")]


AGENT = Agent(
    name="invoice_numbers", system="You number invoices.", instructions="Number acme's.",
    tools=[number_invoice], input_schema={{"type": "object"}}, script=_number_then_answer,
)
"""
OLD_KEY = "invoice-number:acme"


@pytest.fixture
def numbering(
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    register_agents: Callable[..., None],
    processes: ProcessFactory,
) -> Iterator[Callable[[str | None, str], tuple[str, Path]]]:
    """numbering(key, label) -> (run id, numbers log): a run started by the release whose tool
    asks once(OLD_KEY) and labels its answer "old", whose worker died right after once()
    committed, then a worker of the release whose tool asks once(key) (None: no once(), the
    number 7) and labels "label" (its code alone changed) taking it over; the agent's policy
    is `continue`."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    numbers = tmp_path / "numbers.log"
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_NUMBERS_LOG", str(numbers))
    get_settings.cache_clear()

    def release(name: str, key: str | None, label: str) -> str:
        directory = tmp_path / name
        directory.mkdir()
        source = NUMBERING_MODULE.format(key=key, label=label)
        (directory / "invoice_numbers_agent.py").write_text(source)
        return str(directory)

    def started(key: str | None, label: str) -> tuple[str, Path]:
        old, new = release("release-1", OLD_KEY, "old"), release("release-2", key, label)
        path = os.environ["PYTHONPATH"]
        monkeypatch.syspath_prepend(old)
        register_agents("invoice_numbers_agent:AGENT")
        processes("beat", beat=True)  # its tick hands the dead worker's run on
        doomed = processes("old", env={
            "PYTHONPATH": f"{old}{os.pathsep}{path}",
            "NIGHTSHIFT_CRASH_POINTS": "after_once_committed",
        })  # fmt: skip
        run_id = str(start_run("invoice_numbers", {}).run_id)
        wait_for(doomed.exited, timeout=60, what="the old release's worker to die")
        assert numbers.read_text() == "allocated\n"
        processes("new", env={"PYTHONPATH": f"{new}{os.pathsep}{path}"})
        return run_id, numbers

    yield started
    sys.modules.pop("invoice_numbers_agent", None)


def test_a_replayed_once_the_new_tool_code_would_not_make_parks_the_run(
    numbering: Callable[[str | None, str], tuple[str, Path]],
) -> None:
    # given a run whose tool journaled once("invoice-number:acme") before its worker died, and
    # a release whose tool code alone changed: it asks once("invoice:acme:2026") instead
    run_id, numbers = numbering("invoice:acme:2026", "new")

    # when its worker replays the call under the policy `continue`
    row = wait_for_status(run_id, {s.value for s in RunStatus if s.value != "running"}, timeout=90)

    # then the run waits for a person, saying which recorded call the new code would not make,
    # and nothing was allocated under the new key
    assert (row.status, row.stop_reason) == (RunStatus.NEEDS_ATTENTION, "non_determinism"), row
    assert "once('invoice-number:acme')" in row.error and "once('invoice:acme:2026')" in row.error
    assert row.waiting_on == f"version:{row.running_version}" != f"version:{row.agent_version}"
    assert numbers.read_text() == "allocated\n"
    assert tool_results_of(run_id) == []

    # when a person allows the new code, the call runs as it now asks: a number of its own
    allow_version(run_id, Actor("lead@example.com", "test"), note="the new numbering is intended")
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=60)
    assert numbers.read_text() == "allocated\nallocated\n"
    assert [json.loads(r) for r in tool_results_of(run_id)] == [{"number": 1002, "label": "new"}]


def test_a_replayed_once_the_new_tool_code_still_makes_returns_the_recorded_value(
    numbering: Callable[[str | None, str], tuple[str, Path]],
) -> None:
    # given the same crash, and a release whose tool code changed only its label
    run_id, numbers = numbering(OLD_KEY, "relabelled")

    # when its worker replays the call under the policy `continue`
    row = wait_for_status(run_id, {s.value for s in RunStatus if s.value != "running"}, timeout=90)

    # then it is a new version, and the recorded number comes back: none allocated again
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert row.running_version != row.agent_version
    assert numbers.read_text() == "allocated\n"
    recorded = [json.loads(r) for r in tool_results_of(run_id)]
    assert recorded == [{"number": 1001, "label": "relabelled"}]


def test_a_recorded_once_the_new_tool_code_no_longer_makes_parks_the_run(
    numbering: Callable[[str | None, str], tuple[str, Path]],
) -> None:
    # given the same crash, and a release whose tool numbers the invoice without once()
    run_id, _ = numbering(None, "new")

    # when its worker replays the call under the policy `continue`
    row = wait_for_status(run_id, {s.value for s in RunStatus if s.value != "running"}, timeout=90)

    # then the run waits for a person: the recorded number would be left behind unnoticed
    assert (row.status, row.stop_reason) == (RunStatus.NEEDS_ATTENTION, "non_determinism"), row
    assert "once('invoice-number:acme')" in row.error and "no longer makes it" in row.error
    assert tool_results_of(run_id) == []
