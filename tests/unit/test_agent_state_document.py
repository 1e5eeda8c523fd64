"""The agent state a tool reads and writes: JSON only, copies on reading, the runtime's
`artifacts` entry not the agent's, and a bound that refuses a change and keeps the rest; the
step's replay follows what each journaled call left."""

from __future__ import annotations

import pytest

from pipeline.engine.journal import Entry
from pipeline.engine.state_replay import StepState
from pipeline.errors import AgentStateTooLarge, PermanentError
from pipeline.runs.summaries import summarize
from pipeline.tools import AgentState
from pipeline.tools.agent_state import size_of


def test_a_value_read_is_a_copy_and_only_set_changes_the_state() -> None:
    state = AgentState({"plan": ["draft"]})

    state["plan"].append("send")  # a copy: not kept
    assert state["plan"] == ["draft"]

    state.set("plan", ("draft", "send"))
    assert state.document() == {"plan": ["draft", "send"]}  # as JSON gives it back
    state.delete("plan")
    state.delete("never there")
    assert dict(state) == {} and "plan" not in state


def test_a_value_that_is_not_json_or_a_runtime_key_is_refused_and_nothing_changes() -> None:
    state = AgentState({"facts": {"owner": "priya"}})

    with pytest.raises(PermanentError, match="'when': the value \\(object\\) cannot be kept as"):
        state.set("when", object())
    with pytest.raises(PermanentError, match="'artifacts' is the runtime's"):
        state.set("artifacts", {})
    with pytest.raises(PermanentError, match="keys are non-empty strings"):
        state.set("", 1)
    assert state.document() == {"facts": {"owner": "priya"}}


def test_a_change_past_the_bound_names_the_setting_and_keeps_what_was_there() -> None:
    state = AgentState({"plan": ["draft"]}, max_bytes=40)

    with pytest.raises(AgentStateTooLarge) as refused:
        state.set("notes", "x" * 40)

    assert str(refused.value) == (
        "agent state 'notes': the state would be 69 bytes, over the 40-byte limit "
        "(NIGHTSHIFT_AGENT_STATE_MAX_BYTES); nothing was changed"
    )
    assert isinstance(refused.value, PermanentError)  # the model reads it as the tool's error
    assert state.document() == {"plan": ["draft"]}
    assert size_of({"plan": ["draft"]}) == 18


def test_a_step_follows_the_journaled_calls_and_checkpoints_only_a_change() -> None:
    # given a run whose last checkpoint left a plan beside the runtime's artifacts
    loaded = {"plan": ["a"], "artifacts": {"report": {"id": 1}}}
    step = StepState(loaded, [], step=3, max_bytes=1024)

    # when a call reads it and changes nothing, the checkpoint writes nothing
    assert step.changed_by(step.for_call()) is None
    assert step.to_checkpoint() is None

    # when a call replayed from the journal left a document, the next call sees that one
    step.follow({"content": "ok", "state": {"plan": ["a", "b"]}})
    seen = step.for_call()
    assert seen["plan"] == ["a", "b"]
    seen.set("done", ["a"])
    left = step.changed_by(seen)
    assert left == {"plan": ["a", "b"], "done": ["a"]}
    step.follow({"content": "ok", "state": left})

    # then the checkpoint writes the last document, and the run's state keeps its artifacts
    assert step.to_checkpoint() == {"plan": ["a", "b"], "done": ["a"]}
    assert step.run_state() == {**left, "artifacts": {"report": {"id": 1}}}


def test_the_timeline_names_the_keys_a_call_left() -> None:
    result = {"name": "tick_off", "content": "ok", "is_error": False}

    assert summarize("tool:toolu_1", result) == "tick_off -> ok: 'ok'"
    left = summarize("tool:toolu_1", {**result, "state": {"plan": [], "done": []}})
    assert left == "tick_off -> ok: 'ok'; state: done, plan"
    assert summarize("tool:toolu_1", {**result, "state": {}}).endswith("; state: empty")


def test_a_step_starts_from_what_the_journal_of_the_steps_before_it_left() -> None:
    # given a journal copied from another run (a fork): its record holds no agent state yet
    def tool_entry(step: int, call: str, **state: object) -> Entry:
        payload = {"name": "t", "content": "ok", "is_error": False}
        return Entry(f"tool:{call}", step, "t", {**payload, **({"state": state} if state else {})})

    entries = [
        Entry("model:0", 0, "ask_model", {"content": []}),
        tool_entry(0, "a", plan=["a", "b"]),
        tool_entry(1, "b", plan=["a", "b"], done=["a"]),
        tool_entry(1, "c"),  # changed nothing
        tool_entry(2, "d", plan=["a", "b"], done=["a", "b"]),  # the step being run again
    ]

    # when step 2 starts
    step = StepState({}, entries, step=2, max_bytes=1024)

    # then it sees what step 1 left (its own entries are replayed by its calls), and its
    # checkpoint writes that to the record even if its calls change nothing
    assert step.document == {"plan": ["a", "b"], "done": ["a"]}
    assert step.to_checkpoint() == {"plan": ["a", "b"], "done": ["a"]}
    assert StepState({"plan": ["a", "b"], "done": ["a"]}, entries, 2, 1024).to_checkpoint() is None
