"""The benchmark agents: `bench`, a run of N steps, each asking for one cheap local read-only
tool, whose schedule job is a night's batch of such runs; and `bench_synthesis`, that batch's
synthesis, which counts the children's outcomes.

Registered only where benchmarks and tests run (NIGHTSHIFT_AGENTS=bench.agents:AGENT,
bench.agents:SYNTHESIS: bench/scratch.py and tests/conftest.py set it), never as a production
entry point. Nothing here waits on the network, so what a benchmark measures is the
runtime (claim, journal, checkpoint, hand-off, fan-out and join) and whatever latency the model
adds: the local Messages API server's, or the script's own `model_seconds` (a model that takes
that long).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from pipeline import (
    Agent,
    BatchPlan,
    Conversation,
    Slot,
    ToolContext,
    text,
    tool,
    tool_use,
)

MAX_STEPS = 5000


@tool(
    name="bench_echo",
    description="Echo a number back (a cheap local read-only tool for benchmarks).",
    schema={
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0}},
        "required": ["n"],
        "additionalProperties": False,
    },
)
def bench_echo(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return {"echo": args["n"]}


def script(conversation: Conversation) -> list[dict[str, Any]]:
    """One echo a step until the last step, which only answers (so a run has `steps` steps)."""
    # The history is the first message plus an (assistant, tool results) pair per step: O(1)
    # here, so the benchmark's model costs the same at step 1,000 as at step 10.
    step = (len(conversation.messages) - 1) // 2
    # A model's latency, in process (bench/batch_throughput.py): what the step waits on.
    time.sleep(conversation.input.get("model_seconds", 0))
    if step < conversation.input["steps"] - 1:
        return [text(f"Step {step}."), tool_use(step, 0, "bench_echo", {"n": step})]
    return [text(f"Done after {step + 1} steps.")]


def night_job(slot: Slot) -> BatchPlan:
    """A night's batch (bench/night_scale.py): the schedule's params say how many children
    (`children`), their steps and model latency; bench_synthesis runs once all are done."""
    child: dict[str, Any] = {"steps": int(slot.params.get("steps", 2))}
    if slot.params.get("model_seconds"):
        child["model_seconds"] = float(slot.params["model_seconds"])
    children = int(slot.params.get("children", 1))
    return BatchPlan(
        batch_id=slot.key,
        name="bench_night",
        child_agent="bench",
        child_inputs=[dict(child) for _ in range(children)],
        synthesis_agent="bench_synthesis",
        params={"children": children, **child},
    )


AGENT = Agent(
    name="bench",
    system="You are a benchmark agent. Call bench_echo once a step until the last step.",
    instructions="Call bench_echo with the step number, once a step, then say you are done.",
    tools=(bench_echo,),
    input_schema={
        "type": "object",
        "properties": {
            "steps": {"type": "integer", "minimum": 1, "maximum": MAX_STEPS},
            "label": {"type": "string", "maxLength": 100},
            "model_seconds": {"type": "number", "minimum": 0, "maximum": 60},
        },
        "required": ["steps"],
        "additionalProperties": False,
    },
    script=script,
    max_steps=MAX_STEPS,
    job=night_job,
)


def synthesis_script(conversation: Conversation) -> list[dict[str, Any]]:
    """One answer: how many children ended how, after the children's model latency."""
    children = conversation.input["children"]
    if children:
        time.sleep(children[0]["item"].get("model_seconds", 0))
    ended = Counter(child["status"] for child in children)
    counted = ", ".join(f"{count} {status}" for status, count in sorted(ended.items()))
    return [text(f"{len(children)} children: {counted or 'none'}.")]


SYNTHESIS = Agent(
    name="bench_synthesis",
    system="You are a benchmark batch's synthesis. Count how the children ended.",
    instructions="Say how many children there were and how many ended in each status.",
    tools=(),
    input_schema={
        "type": "object",
        "properties": {
            "batch": {"type": "string"},
            "children": {"type": "array", "items": {"type": "object"}},
            "stopped": {"type": "object"},
        },
        "required": ["batch", "children"],
        "additionalProperties": False,
    },
    script=synthesis_script,
    max_steps=2,
)
