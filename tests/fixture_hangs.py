"""An agent whose tool hangs on the first call ever made (a service that never answers), for
the step time limit's tests; registered through NIGHTSHIFT_AGENTS like a user's own."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline import Agent, ToolContext, tool
from pipeline.agent_definition import Block, Conversation, text, tool_use


def _look_up_once(tool: str) -> Callable[[Conversation], list[Block]]:
    """A script: look the input's word up once with `tool`, then say what came back."""

    def script(conversation: Conversation) -> list[Block]:
        if not conversation.tool_results():
            return [tool_use(0, 0, tool, {"word": conversation.input["word"]})]
        return [text(f"Found: {conversation.tool_results()[-1]['content']}")]

    return script


@tool(
    description="Look a word up in a slow service (it hangs on the first call ever made).",
    schema={
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 40}},
        "required": ["word"],
        "additionalProperties": False,
    },
)
def look_up(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    # The first call anywhere hangs (HANG_MARKER says so, for every worker); later ones answer.
    marker = Path(os.environ["HANG_MARKER"])
    if not marker.exists():
        marker.write_text("hanging")
        time.sleep(float(os.environ["HANG_SECONDS"]))
        marker.write_text("woke up")
    return {"meaning": f"{args['word']} (looked up)"}


HANGS_ONCE = Agent(
    name="hangs_once",
    system="You look words up.",
    instructions="Look the input's word up with the look_up tool, then say what you found.",
    tools=(look_up,),
    input_schema={
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 40}},
        "required": ["word"],
    },
    script=_look_up_once("look_up"),
)


def _three_slow_calls(conversation: Conversation) -> list[Block]:
    """Three slow look-ups in one reply, then say what came back."""
    if not conversation.tool_results():
        words = ("dusk", "night", "dawn")
        return [tool_use(0, i, "slow_look_up", {"word": w}) for i, w in enumerate(words)]
    return [text(f"Found {len(conversation.tool_results())} words.")]


@tool(
    description="Look a word up in a service that takes SLOW_SECONDS to answer.",
    schema={
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 40}},
        "required": ["word"],
        "additionalProperties": False,
    },
)
def slow_look_up(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    time.sleep(float(os.environ["SLOW_SECONDS"]))
    return {"meaning": f"{args['word']} (looked up slowly)"}


SLOW_THRICE = Agent(
    name="slow_thrice",
    system="You look words up, slowly.",
    instructions="Look three words up with slow_look_up, then say how many you found.",
    tools=(slow_look_up,),
    input_schema={"type": "object"},
    script=_three_slow_calls,
)


SLOW_ONCE = dataclasses.replace(
    HANGS_ONCE,
    name="slow_once",
    instructions="Look the input's word up with slow_look_up, then say what you found.",
    tools=(slow_look_up,),
    script=_look_up_once("slow_look_up"),
)
"""A run whose first step is in flight for SLOW_SECONDS: a neighbour a killed process takes
down with it."""
