"""An agent with max_concurrent_runs, for the flow-control tests: each step's tool notes when it
ran (a line in the file its input names), so a test can count the steps in flight at once."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from pipeline import Agent, Conversation, ToolContext, text, tool, tool_use

LIMIT = 5


@tool(
    name="hold",
    description="Hold the step for a while and note when it ran.",
    schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
)
def hold(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    started = time.time()
    time.sleep(0.4)
    line = json.dumps({"run": str(context.run_id), "started": started, "ended": time.time()})
    fd = os.open(context.run_input["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())  # one write: lines of two processes never mix
    finally:
        os.close(fd)
    return {"held": args["n"]}


def script(conversation: Conversation) -> list[dict[str, Any]]:
    step = (len(conversation.messages) - 1) // 2
    if step < 2:
        return [text(f"Step {step}."), tool_use(step, 0, "hold", {"n": step})]
    return [text("Done.")]


TURNS = Agent(
    name="flow_turns",
    system="Hold twice, then say you are done.",
    instructions="Call hold once a step, twice, then answer.",
    tools=(hold,),
    input_schema={"type": "object", "properties": {"log": {"type": "string"}}, "required": ["log"]},
    script=script,
    max_concurrent_runs=LIMIT,
)
