"""Agent state: a plan a tool keeps survives a worker killed in the next step, applied once;
offline (pipeline.testing) the same step keeps it, a failed call changes nothing and a change
past NIGHTSHIFT_AGENT_STATE_MAX_BYTES is the tool's error with the state kept as it was; `show`,
the API's run and the status page show it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from models import RunStatus
from pipeline import Agent, PermanentError, ToolContext, text, tool, tool_use
from pipeline.cli.main import main
from pipeline.runs.start import start_run
from pipeline.testing import run_agent, tool_context
from tests.fixture_planner import ITEMS, PLANNER, tick_off
from tests.integration.api_fixtures import AUTH, client, person_token, submit_login
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import run_row, tool_results, wait_for, wait_for_status

DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}
KEPT = {"plan": ITEMS, "done": ITEMS}


def test_a_plan_survives_a_worker_killed_in_the_next_step_and_is_applied_once(
    sandbox: Sandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # given a worker that dies in step 1, once its first tick_off is journaled (step 0's
    # write_plan, its reply's last call, was checkpointed with the plan)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the agent's own script answers
    register_agents("tests.fixture_planner:PLANNER")
    processes("beat", beat=True)  # its tick hands the dead worker's run on
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_tool_journaled"})
    run_id = start_run("planner", {"items": ITEMS}).run_id
    wait_for(doomed.exited, timeout=60, what="the worker to die in step 1")
    dead = run_row(run_id)
    assert dead.step == 1 and dead.state == {"plan": ITEMS, "done": []}

    # when another worker takes the run over
    processes("w2")
    row = wait_for_status(run_id, DONE, timeout=90)

    # then it found the plan, replayed the journaled tick_off (its change, not a second one)
    # and ran the others: every item done once, in order, as the success check wants
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert row.state == KEPT and row.result["state"] == KEPT
    ticks = tool_results(run_id, "tick_off")
    assert [t["is_error"] for t in ticks] == [False] * len(ITEMS)
    assert [t["state"]["done"] for t in ticks] == [ITEMS[:n] for n in range(1, len(ITEMS) + 1)]

    # and `show`, the API's run and the status page show it
    assert main(["show", str(run_id)]) == 0
    shown = capsys.readouterr().out
    assert "agent state (as the last checkpoint left it):" in shown and '"review"' in shown
    assert "tick_off -> ok: '{\"done\": 3, \"of\": 3}'; state: done, plan" in shown
    api = client(AUTH)
    assert api.get(f"/runs/{run_id}").json()["run"]["agent_state"] == KEPT
    browser = client()
    assert submit_login(browser, {"token": person_token()}).status_code == 200
    page = browser.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200 and 'id="agent-state"' in page.text
    assert "&#34;review&#34;" in page.text or '"review"' in page.text


def test_offline_the_same_step_keeps_the_plan_and_the_success_check_reads_it() -> None:
    run = run_agent(PLANNER, {"items": ITEMS})

    assert run.status == "succeeded" and run.answer == "Every item is done."
    assert run.state == KEPT and run.result is not None and run.result["state"] == KEPT
    assert [c.result for c in run.calls] == [
        {"planned": 3}, {"done": 1, "of": 3}, {"done": 2, "of": 3}, {"done": 3, "of": 3},
    ]  # fmt: skip


def test_a_change_past_the_bound_is_the_tools_error_and_the_state_stays_as_it_was() -> None:
    # given a bound the plan and two ticks fit in (60 bytes as compact JSON)
    planner = dataclasses.replace(PLANNER, max_steps=3)
    run = run_agent(planner, {"items": ITEMS}, env={"NIGHTSHIFT_AGENT_STATE_MAX_BYTES": "60"})

    # then the third tick is refused to the model with the limit named, and nothing kept was
    # lost; the success check, reading the state, never passes
    last = run.calls[-1]
    assert last.is_error and last.result == (
        "tick_off failed: agent state 'done': the state would be 67 bytes, over the 60-byte "
        "limit (NIGHTSHIFT_AGENT_STATE_MAX_BYTES); nothing was changed"
    )
    assert run.state == {"plan": ITEMS, "done": ITEMS[:2]}
    assert run.status == "failed" and run.reason == "max_steps"


@tool
def note_then_fail(fact: str, context: ToolContext) -> str:
    """Note a fact, then fail."""
    context.state.set("fact", fact)
    raise PermanentError("the service said no")


def test_a_call_that_fails_changes_nothing_the_next_call_sees() -> None:
    seen: list[Any] = []

    @tool
    def read_fact(context: ToolContext) -> str:
        """Say what fact is kept."""
        seen.append(context.state.get("fact", "none"))
        return "read"

    agent = Agent(
        name="forgetful", system="You note facts.", instructions="Note one fact.",
        tools=(note_then_fail, read_fact), input_schema={"type": "object"},
    )  # fmt: skip
    replies = [
        [tool_use(0, 0, "note_then_fail", {"fact": "x"}), tool_use(0, 1, "read_fact", {})],
        "Done.",
    ]
    run = run_agent(agent, {}, replies=replies)

    assert run.status == "succeeded"
    assert seen == ["none"] and run.state == {}
    assert run.calls[0].is_error and "the service said no" in run.calls[0].result


def test_a_tool_called_directly_reads_and_leaves_the_state_it_was_given() -> None:
    context = tool_context(PLANNER, {"items": ITEMS}, state={"plan": ITEMS, "done": []})

    assert tick_off.run({"item": "draft"}, context) == {"done": 1, "of": 3}
    assert context.state.document() == {"plan": ITEMS, "done": ["draft"]}
    with pytest.raises(PermanentError, match="'lunch' is not in the plan"):
        tick_off.run({"item": "lunch"}, context)


def test_a_script_sees_only_the_messages_not_the_state() -> None:
    # the script stands in for the model, which reads the state only through what tools return
    answered: list[str] = []

    def script(conversation: Any) -> list[Any]:
        answered.append(repr(conversation.state))
        return [text("Done.")]

    run_agent(dataclasses.replace(PLANNER, script=script, check_success=None), {"items": []})
    assert answered == ["{}"]
