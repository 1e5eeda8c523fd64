"""The follow-up agent: checks on a deploy now, waits (no process) and checks again later."""

from __future__ import annotations

from typing import Any

from pipeline import Agent, Conversation, check_back_in, text, tool_use
from pipeline.agents.nightly_report import fetch_source


def script(conversation: Conversation) -> list[dict[str, Any]]:
    step = conversation.assistant_turns()
    used = [block["name"] for block in conversation.tool_uses()]
    if not used:
        return [tool_use(step, 0, "fetch_source", {"name": "deploys"})]
    if "check_back_in" not in used:
        wait = {"seconds": conversation.input["after_seconds"], "reason": "let the deploy settle"}
        return [tool_use(step, 0, "check_back_in", wait)]
    if used.count("fetch_source") < 2:
        return [tool_use(step, 0, "fetch_source", {"name": "deploys"})]
    return [text("Checked the deploys before and after the wait.")]


AGENT = Agent(
    name="follow_up",
    system="You watch deploys: look now, wait, and look again.",
    instructions="Fetch the deploys source, wait with check_back_in, then fetch it again.",
    tools=(fetch_source, check_back_in),
    input_schema={
        "type": "object",
        "properties": {"after_seconds": {"type": "integer", "minimum": 1, "maximum": 2592000}},
        "required": ["after_seconds"],
        "additionalProperties": False,
    },
    script=script,
    max_steps=8,
)
