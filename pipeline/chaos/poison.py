"""A poison agent for the chaos harness and the tests: its one tool kills the worker process
that runs it (as a tool that segfaults or runs out of memory would). Its runs must end failed
with reason `crashed_worker` after the agent's max_step_attempts, and the runs that shared the
killed process must finish. Registered only where it is wanted (NIGHTSHIFT_AGENTS
`pipeline.chaos.poison:POISON`): it is not one of the shipped agents."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from pipeline.agent_definition import Agent, Block, Conversation, text, tool_use
from pipeline.tools import ToolContext, tool

AGENT_PATH = "pipeline.chaos.poison:POISON"
KILL_MARK = "poison tool: killing its own process, pid"


@tool(
    description="Crunch a number (kills the process that runs it).",
    schema={
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    },
)
def crunch(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    # The harness tells this exit from one nobody caused by the line (pipeline/chaos/cluster.py).
    logging.getLogger("nightshift.chaos").warning("%s %d", KILL_MARK, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: the process was killed")


def _crunch_script(conversation: Conversation) -> list[Block]:
    if not conversation.tool_results():
        return [tool_use(0, 0, "crunch", {"n": conversation.input["n"]})]
    return [text("Crunched.")]


POISON = Agent(
    name="poison",
    system="You crunch numbers with a tool that kills its worker.",
    instructions="Crunch the input's number with the crunch tool, then say you did.",
    tools=(crunch,),
    input_schema={
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
    },
    script=_crunch_script,
)
