"""Stop reasons, prompt-cache breakpoints and prices, and the local Messages API's cut-offs and
cache usage as the real `anthropic` SDK reads them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from pipeline.agent_definition import Agent, text
from pipeline.engine import stops
from pipeline.engine.llm import request_for
from pipeline.engine.usage import Usage
from pipeline.errors import SettingsError
from pipeline.prices import ModelPrice, PriceTable
from pipeline.sandbox import MessagesSandbox
from pipeline.sandbox.responders import text_reply, tool_use_reply
from pipeline.settings import Settings

AGENT = Agent(
    name="echo",
    system="You echo.",
    instructions="Echo the input.",
    tools=(),
    input_schema={"type": "object"},
    script=lambda conversation: [text("echo")],
)
TOOL: Any = {
    "name": "write_file",
    "description": "Write a file.",
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path"],
    },
}


@pytest.fixture
def messages(tmp_path: Path) -> Iterator[MessagesSandbox]:
    with MessagesSandbox(log_path=tmp_path / "messages.jsonl") as server:
        yield server


def sdk(server: MessagesSandbox) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test", base_url=server.url, max_retries=0, timeout=5)


# -- stop reasons ------------------------------------------------------------------------------


def test_a_cut_off_reply_is_asked_again_with_twice_the_room_up_to_the_cap() -> None:
    assert [stops.room_for(1024, 8192, attempt) for attempt in range(5)] == [
        1024, 2048, 4096, 8192, None,
    ]  # fmt: skip
    assert [stops.room_for(1000, 2500, attempt) for attempt in range(4)] == [
        1000, 2000, 2500, None,
    ]  # fmt: skip
    # a cap below the agent's own max_tokens never shrinks the first call
    assert [stops.room_for(4096, 1024, attempt) for attempt in range(2)] == [4096, None]


@pytest.mark.parametrize(
    ("stop_reason", "run_reason"),
    [("refusal", "refusal"), ("model_context_window_exceeded", "context_window"),
     ("something_new", "model_error")],
)  # fmt: skip
def test_replies_that_cannot_go_on_stop_the_run_with_a_reason(
    stop_reason: str, run_reason: str
) -> None:
    stop = stops.stop_for_reply({"stop_reason": stop_reason, "content": []})
    assert stop is not None and stop.reason == run_reason


def test_a_refusal_names_what_the_api_said() -> None:
    details = {"type": "refusal", "category": "cyber", "explanation": "exploit code"}
    stop = stops.stop_for_reply({"stop_reason": "refusal", "stop_details": details})
    assert stop is not None and "exploit code" in str(stop)


@pytest.mark.parametrize("stop_reason", ["end_turn", "tool_use", "pause_turn", "stop_sequence"])
def test_complete_replies_go_on(stop_reason: str) -> None:
    assert stops.stop_for_reply({"stop_reason": stop_reason}) is None


# -- prompt-cache breakpoints ----------------------------------------------------------------


def conversation(turns: int) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [AGENT.first_message({"n": 1})]
    for n in range(turns):
        use = {"type": "tool_use", "id": f"t{n}", "name": "write_file", "input": {"path": "a"}}
        history.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": "ok"}
        history.append({"role": "user", "content": [result]})
    return history


def breakpoints(request: dict[str, Any]) -> list[str]:
    marked = ["system"] if isinstance(request["system"], list) else []
    for index, message in enumerate(request["messages"]):
        content = message["content"]
        if isinstance(content, list) and any("cache_control" in b for b in content):
            marked.append(f"messages[{index}]")
    return marked


def test_breakpoints_sit_on_the_system_prompt_and_the_last_two_user_turns() -> None:
    history = conversation(turns=2)
    request = request_for(AGENT, history, max_tokens=100, caching=True)
    assert breakpoints(request) == ["system", "messages[2]", "messages[4]"]
    # the journal's own messages are not touched
    assert all("cache_control" not in str(message) for message in history)
    assert breakpoints(request_for(AGENT, history[:1], max_tokens=100, caching=True)) == [
        "system", "messages[0]",
    ]  # fmt: skip
    assert breakpoints(request_for(AGENT, history, max_tokens=100, caching=False)) == []


def test_a_long_run_pays_mostly_cache_reads(messages: MessagesSandbox) -> None:
    # given a conversation that grows by a tool call and its result each call
    messages.responder = lambda request: text_reply("noted")
    llm = sdk(messages)
    usages = []
    for turns in range(6):
        request = request_for(AGENT, conversation(turns), max_tokens=100, caching=True)
        usages.append(llm.messages.create(model="claude-test", **request).usage)

    # then the first call writes the prefix and every later one reads what the one before wrote
    first, *later = usages
    assert first.cache_creation_input_tokens and not first.cache_read_input_tokens
    for before, usage in zip(usages, later, strict=False):
        assert usage.cache_read_input_tokens == (
            (before.cache_read_input_tokens or 0) + (before.cache_creation_input_tokens or 0)
        )
    last = usages[-1]
    assert last.cache_read_input_tokens > last.input_tokens + last.cache_creation_input_tokens


def test_without_breakpoints_nothing_is_cached(messages: MessagesSandbox) -> None:
    messages.responder = lambda request: text_reply("noted")
    llm = sdk(messages)
    for _ in range(2):
        request = request_for(AGENT, conversation(2), max_tokens=100, caching=False)
        usage = llm.messages.create(model="claude-test", **request).usage
    assert usage.cache_read_input_tokens == usage.cache_creation_input_tokens == 0


# -- the local server's cut-offs -------------------------------------------------------------


def test_a_reply_past_max_tokens_is_cut_off_and_a_tool_call_loses_the_parameter_being_written(
    messages: MessagesSandbox,
) -> None:
    # given a model that writes a file whose content is longer than max_tokens allows
    write = {"path": "notes.txt", "content": "x" * 2000}
    messages.responder = lambda request: tool_use_reply("write_file", write, text="Writing.")
    llm = sdk(messages)
    hi: Any = [{"role": "user", "content": "write it"}]

    # when the call leaves too little room
    cut = llm.messages.create(model="m", max_tokens=200, messages=hi, tools=[TOOL])
    whole = llm.messages.create(model="m", max_tokens=1000, messages=hi, tools=[TOOL])

    # then the reply stops at max_tokens, and its tool call looks valid but lacks the content
    assert (cut.stop_reason, cut.usage.output_tokens) == ("max_tokens", 200)
    assert [b.type for b in cut.content] == ["text", "tool_use"]
    assert cut.content[1].input == {"path": "notes.txt"}  # type: ignore[union-attr]
    assert whole.stop_reason == "tool_use"
    assert whole.content[1].input == write  # type: ignore[union-attr]


def test_a_responder_can_refuse_or_pause(messages: MessagesSandbox) -> None:
    details = {"type": "refusal", "category": "cyber", "explanation": "no exploits"}
    replies = iter(
        [
            {"content": [], "stop_reason": "refusal", "stop_details": details},
            {"content": [{"type": "text", "text": "Searching"}], "stop_reason": "pause_turn"},
        ]
    )
    messages.responder = lambda request: next(replies)
    llm = sdk(messages)
    hi: Any = [{"role": "user", "content": "hi"}]
    refused = llm.messages.create(model="m", max_tokens=100, messages=hi)
    paused = llm.messages.create(model="m", max_tokens=100, messages=hi)
    assert refused.stop_reason == "refusal"
    assert refused.stop_details is not None and refused.stop_details.category == "cyber"
    assert paused.stop_reason == "pause_turn"


# -- prices ------------------------------------------------------------------------------------


def test_prices_per_model_price_cache_writes_and_reads_on_their_own() -> None:
    settings = Settings.from_env(
        {
            "NIGHTSHIFT_MODEL_PRICES": '{"claude-haiku": {"input": 1, "output": 5}, '
            '"claude-haiku-4-5": {"input": 2, "output": 10, "cache_read": 0.5}}'
        }
    )
    usage = {
        "input_tokens": 1_000_000,
        "output_tokens": 1_000_000,
        "cache_creation_input_tokens": 1_000_000,
        "cache_read_input_tokens": 1_000_000,
    }
    haiku = settings.prices.price_for("claude-haiku-4-5-20251001")
    assert haiku == ModelPrice(2.0, 10.0, cache_write=2.5, cache_read=0.5)
    assert haiku.cost_usd(usage) == pytest.approx(2 + 10 + 2.5 + 0.5)
    assert settings.prices.price_for("claude-haiku-3") == ModelPrice(1, 5, 1.25, 0.1)
    assert settings.prices.price_for("claude-opus-4") == settings.prices.default
    reply = {"model": "claude-haiku-4-5", "usage": usage}
    assert Usage.of(reply, settings.prices).cost_usd == pytest.approx(15.0)


@pytest.mark.parametrize(
    "raw",
    ['{"m": {"input": 1}}', '{"m": {"input": 1, "output": -2}}', "[1]", "{",
     '{"m": {"input": 1, "output": 2, "writes": 3}}'],
)  # fmt: skip
def test_malformed_model_prices_are_refused_with_the_setting_named(raw: str) -> None:
    with pytest.raises(SettingsError, match="NIGHTSHIFT_MODEL_PRICES"):
        Settings.from_env({"NIGHTSHIFT_MODEL_PRICES": raw})


def test_the_default_price_applies_the_cache_multipliers_to_the_input_price() -> None:
    settings = Settings.from_env({"NIGHTSHIFT_PRICE_INPUT_PER_MTOK": "4"})
    assert settings.prices == PriceTable(ModelPrice(4.0, 15.0, cache_write=5.0, cache_read=0.4))


def test_the_scripted_model_costs_nothing_and_a_real_one_is_priced() -> None:
    from pipeline.engine.usage import SCRIPTED_MODEL, Usage
    from pipeline.prices import ModelPrice, PriceTable

    prices = PriceTable(default=ModelPrice(input=3, output=15, cache_write=3.75, cache_read=0.3))
    usage = {"input_tokens": 1_000_000, "output_tokens": 0}
    assert Usage.of({"model": SCRIPTED_MODEL, "usage": usage}, prices).cost_usd == 0
    assert Usage.of({"model": "claude-sonnet-4-5", "usage": usage}, prices).cost_usd == 3
    assert Usage.of({"model": SCRIPTED_MODEL, "usage": usage}, prices).input_tokens == 1_000_000
