"""Stop reasons and prompt caching through the real `anthropic` SDK, a real worker and the local
Messages API: a cut-off reply is never acted on, a refusal fails the run, a paused turn goes on,
and a run's cost is its calls' cache writes and reads at their own prices."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select

from models import JournalEntry, RunStatus
from pipeline.db import transaction
from pipeline.runs.start import start_run
from pipeline.sandbox.base import read_log
from pipeline.sandbox.responders import agent_responder, content_blocks
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import wait_for, wait_for_status

RUN_INPUT = {"team": "ops", "date": "2026-11-29"}
KEY = "nightly_report:2026-11-29:ops"
STEPS = 6
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}
PADDING = "All systems nominal. " * 250  # about 1,300 tokens: past 1,024, within 2,048
PRICES = {"claude-sonnet-4-5": {"input": 2, "output": 10, "cache_write": 7, "cache_read": 0.5}}


def answered(sandbox: Sandbox) -> list[dict[str, Any]]:
    """The Messages API's log of the requests it answered, in order."""
    return [e for e in read_log(sandbox.messages.log.path) if e["status"] == 200]


def step_of(entry: dict[str, Any]) -> int:
    return (entry["messages"] - 1) // 2  # step n sends 2n + 1 messages


def rooms(sandbox: Sandbox) -> dict[int, list[int]]:
    """The max_tokens each step asked with, in order (a call retried after a timeout, the same
    request again, counts once)."""
    asked: dict[int, list[int]] = {}
    for entry in answered(sandbox):
        seen = asked.setdefault(step_of(entry), [])
        if not seen or seen[-1] != entry["max_tokens"]:
            seen.append(entry["max_tokens"])
    return asked


def journal(run_id: Any) -> dict[str, dict[str, Any]]:
    with transaction() as session:
        rows = session.execute(
            select(JournalEntry.key, JournalEntry.payload).where(JournalEntry.run_id == run_id)
        ).all()
    return {key: payload for key, payload in rows}


def padded_email(request: dict[str, Any]) -> dict[str, Any]:
    """The nightly report's model, writing an email too long for 1,024 output tokens."""
    reply = agent_responder(request)
    for block in reply["content"]:
        if block["type"] == "tool_use" and block["name"] == "send_report_email":
            block["input"] = {**block["input"], "body": block["input"]["body"] + PADDING}
            del block["id"]  # each call gets a new id from the server, as from Claude
    return reply


def test_a_tool_call_cut_off_at_max_tokens_never_runs_and_the_step_asks_again(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given a model whose email, written with 1,024 tokens of room, is cut off mid-body
    sandbox.messages.responder = padded_email
    processes("w1")

    # when the run reaches that step
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=60)

    # then the cut-off call was journaled apart and never ran; the step asked again with twice
    # the room and sent the whole email once
    assert row.status == RunStatus.SUCCEEDED, row.error
    entries = journal(run_id)
    cut = entries["cut:4:0"]
    assert (cut["stop_reason"], cut["max_tokens"]) == ("max_tokens", 1024)
    cut_use = next(b for b in cut["content"] if b["type"] == "tool_use")
    assert f"tool:{cut_use['id']}" not in entries
    sent = next(b for b in entries["model:4"]["content"] if b["type"] == "tool_use")
    assert sent["input"]["body"].endswith(PADDING) and f"tool:{sent['id']}" in entries
    assert len(sandbox.email.deliveries(KEY)) == 1
    assert rooms(sandbox) == {0: [1024], 1: [1024], 2: [1024], 3: [1024], 4: [1024, 2048],
                              5: [1024]}  # fmt: skip
    # and the run paid for both calls of that step
    assert row.output_tokens == sum(e["usage"]["output_tokens"] for e in entries.values()
                                    if "usage" in e)  # fmt: skip


def test_a_final_answer_still_cut_off_at_the_cap_is_never_the_result(
    sandbox: Sandbox, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a cap of 2,048 tokens and a model whose closing answer needs more
    def rambling(request: dict[str, Any]) -> dict[str, Any]:
        reply = agent_responder(request)
        if not any(b["type"] == "tool_use" for b in reply["content"]):
            reply["content"] = [{"type": "text", "text": "Done. " + PADDING * 2}]
        return reply

    sandbox.messages.responder = rambling
    monkeypatch.setenv("NIGHTSHIFT_MAX_TOKENS_CAP", "2048")
    processes("w1")

    # when the run reaches its last step
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=60)

    # then it fails with reason truncated and no result, having asked with 1,024 and 2,048
    assert (row.status, row.stop_reason, row.result) == (RunStatus.FAILED, "truncated", None)
    assert "cut off at max_tokens=2048" in row.error
    assert rooms(sandbox)[5] == [1024, 2048]
    assert "model:5" not in journal(run_id)


def test_a_step_cut_off_before_a_crash_asks_with_more_room_after_it(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given a worker that dies right after journaling a cut-off reply
    sandbox.messages.responder = padded_email
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_cut_off_journaled"})
    processes("beat", beat=True)
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    wait_for(doomed.exited, timeout=60, what="the worker to die after the cut-off")

    # when another worker takes the run over
    processes("healthy")
    row = wait_for_status(run_id, DONE, timeout=60)

    # then the replay met the journaled cut-off and asked with 2,048 tokens, not 1,024 again
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert rooms(sandbox)[4] == [1024, 2048]
    assert len(sandbox.email.deliveries(KEY)) == 1


def test_a_refusal_fails_the_run_with_reason_refusal(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    details = {"type": "refusal", "category": "general_harms", "explanation": "not this one"}
    sandbox.messages.responder = lambda request: {
        "content": [{"type": "text", "text": "I can"}],
        "stop_reason": "refusal",
        "stop_details": details,
    }
    processes("w1")
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=60)
    assert (row.status, row.stop_reason, row.result) == (RunStatus.FAILED, "refusal", None)
    assert "not this one" in row.error
    assert sum(sandbox.web.requests().values()) == 0
    assert row.output_tokens > 0, "a refused call is paid for too"


def test_a_paused_turn_is_sent_back_and_the_model_continues_it(
    sandbox: Sandbox, processes: ProcessFactory
) -> None:
    # given a model that pauses its first turn
    def pauses_once(request: dict[str, Any]) -> dict[str, Any]:
        if len(request["messages"]) == 1:
            return {"content": [{"type": "text", "text": "Looking."}], "stop_reason": "pause_turn"}
        return agent_responder(request)

    sandbox.messages.responder = pauses_once
    processes("w1")
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=60)

    # then the next call ends with the paused turn, as-is, and the run goes on to the end
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert row.step == STEPS + 1
    requests = [e for e in read_log(sandbox.messages.log.path)]
    assert requests[1]["messages"] == 2 and requests[1]["stop_reason"] == "tool_use"


def test_with_caching_later_calls_read_the_cache_and_the_cost_uses_the_cache_prices(
    sandbox: Sandbox, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given prices with distinct cache-write and cache-read rates (caching is on by default)
    monkeypatch.setenv("NIGHTSHIFT_MODEL_PRICES", json.dumps(PRICES))
    processes("w1")

    # when a six-step run finishes
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=60)
    assert row.status == RunStatus.SUCCEEDED, row.error

    # then the first call wrote the cache and every later call read it, mostly (the usage
    # the local server reported, as the SDK read it and the step journaled it)
    entries = journal(run_id)
    usages = [entries[f"model:{step}"]["usage"] for step in range(STEPS)]
    assert usages[0]["cache_creation_input_tokens"] > 0
    assert usages[0]["cache_read_input_tokens"] == 0
    assert all(u["cache_read_input_tokens"] > 0 for u in usages[1:])
    last = usages[-1]
    assert (
        last["cache_read_input_tokens"] > last["input_tokens"] + last["cache_creation_input_tokens"]
    )
    # and the run recorded each kind of token and priced each at its own rate
    total = {k: sum(u[k] for u in usages) for k in usages[0]}
    assert (row.input_tokens, row.output_tokens) == (total["input_tokens"], total["output_tokens"])
    assert row.cache_creation_input_tokens == total["cache_creation_input_tokens"]
    assert row.cache_read_input_tokens == total["cache_read_input_tokens"]
    price = PRICES["claude-sonnet-4-5"]
    expected = (
        total["input_tokens"] * price["input"]
        + total["output_tokens"] * price["output"]
        + total["cache_creation_input_tokens"] * price["cache_write"]
        + total["cache_read_input_tokens"] * price["cache_read"]
    ) / 1_000_000
    assert row.cost_usd == pytest.approx(expected, rel=1e-6)


def test_with_caching_off_no_request_carries_a_breakpoint(
    sandbox: Sandbox, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []

    def watching(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return agent_responder(request)

    sandbox.messages.responder = watching
    monkeypatch.setenv("NIGHTSHIFT_PROMPT_CACHING", "off")
    processes("w1")
    run_id = start_run("nightly_report", RUN_INPUT).run_id
    row = wait_for_status(run_id, DONE, timeout=60)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert (row.cache_creation_input_tokens, row.cache_read_input_tokens) == (0, 0)
    blocks = [b for r in seen for m in r["messages"] for b in content_blocks(m)]
    assert isinstance(seen[0]["system"], str)
    assert not any("cache_control" in b for b in blocks)
