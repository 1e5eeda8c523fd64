"""Agents whose one side effect is an email that may take a while: `slow_sender` declares that
a send may take 15 s, `hasty_sender` that it takes at most 2 s. Each tool gives its client the
declared time as its timeout, as docs/agents.md tells a tool author to. Registered through
NIGHTSHIFT_AGENTS like a user's own (tests/integration/test_slow_sends.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx

from pipeline import Agent, SideEffect, ToolContext, tool
from pipeline.agent_definition import Block, Conversation, text, tool_use
from pipeline.agents.services import EMAIL, email_effect, service_url
from pipeline.tools import Tool

SCHEMA = {
    "type": "object",
    "properties": {"subject": {"type": "string", "minLength": 1, "maxLength": 200}},
    "required": ["subject"],
    "additionalProperties": False,
}
INPUT = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40}},
    "required": ["name"],
}


def alert_key(args: dict[str, Any], context: ToolContext) -> str:
    return f"alert:{context.run_input['name']}"


def _script(conversation: Conversation) -> list[Block]:
    """Send one alert, then say what came back."""
    if not conversation.tool_results():
        return [tool_use(0, 0, "send_alert", {"subject": f"alert {conversation.input['name']}"})]
    return [text(f"Done: {conversation.tool_results()[-1]['content']}")]


def _alert_tool(effect: SideEffect) -> Tool:
    assert effect.send_timeout is not None
    timeout = httpx.Timeout(effect.send_timeout.total_seconds(), connect=2.0)

    @tool(
        description="Email one alert to the on-call address.",
        schema=SCHEMA,
        side_effect=effect,
        needs=(EMAIL,),
    )
    def send_alert(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        response = httpx.post(
            f"{service_url(context, EMAIL)}/emails",
            json={"to": "oncall@example.com", "subject": args["subject"], "body": "see the run"},
            headers={"Idempotency-Key": context.idempotency_key or ""},
            timeout=timeout,
        )
        response.raise_for_status()
        sent: dict[str, Any] = response.json()
        return sent

    return send_alert


def _sender(name: str, send_timeout: timedelta) -> Agent:
    effect = replace(email_effect(alert_key), send_timeout=send_timeout)
    return Agent(
        name=name,
        system="You send alerts.",
        instructions="Send one alert with send_alert, then say what came back.",
        tools=(_alert_tool(effect),),
        input_schema=INPUT,
        script=_script,
    )


SLOW_SENDER = _sender("slow_sender", timedelta(seconds=15))
HASTY_SENDER = _sender("hasty_sender", timedelta(seconds=2))
