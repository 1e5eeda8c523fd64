"""The benchmark agent: a run of N steps, each asking for one cheap local read-only tool.

Used by `bench/`: nothing here waits on the network, so what a benchmark measures is the
runtime (claim, journal, checkpoint, hand-off) and whatever latency the model adds.
"""

from __future__ import annotations

from typing import Any

from pipeline import Agent, Conversation, ToolContext, text, tool, tool_use

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
    if step < conversation.input["steps"] - 1:
        return [text(f"Step {step}."), tool_use(step, 0, "bench_echo", {"n": step})]
    return [text(f"Done after {step + 1} steps.")]


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
        },
        "required": ["steps"],
        "additionalProperties": False,
    },
    script=script,
    max_steps=MAX_STEPS,
)
