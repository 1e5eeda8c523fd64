"""A release that changes only a tool's code is a new agent version: a run its old code
started meets the agent's on_version_change policy on a worker running the new code."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from models import RunStatus
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import run_row, wait_for, wait_for_status

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
