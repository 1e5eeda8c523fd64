"""Model adapters. Both return the reply as a plain dict in the Messages API's shape."""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Protocol

from pipeline.agent import Agent, Conversation, Message, input_from_messages
from pipeline.settings import Settings

Reply = dict[str, Any]


class Model(Protocol):
    name: str

    def reply(self, agent: Agent, messages: list[Message]) -> Reply:
        """One model call. Raises on failure; the caller classifies and retries."""


class AnthropicModel:
    """The real Messages API through the `anthropic` SDK; nightshift owns the retries."""

    def __init__(self, settings: Settings) -> None:
        import anthropic  # lazy: ~0.7 s to import, and only runs with ANTHROPIC_API_KEY need it

        self.name = settings.model_name
        self._client = anthropic.Anthropic(
            api_key=settings.anthropic_api_key,
            base_url=settings.anthropic_base_url,
            max_retries=0,
            timeout=settings.model_timeout_seconds,
        )

    def reply(self, agent: Agent, messages: list[Message]) -> Reply:
        message = self._client.messages.create(
            model=self.name,
            system=agent.system,
            max_tokens=agent.max_tokens,
            messages=messages,  # type: ignore[arg-type]
            tools=[t.spec() for t in agent.tools],  # type: ignore[misc]
        )
        return message.model_dump(mode="json", exclude_none=True)


class ScriptedModel:
    """A deterministic stand-in that answers with each agent's script (no network, no key)."""

    name = "scripted"

    def reply(self, agent: Agent, messages: list[Message]) -> Reply:
        return scripted_reply(agent, messages, model=self.name)


def scripted_reply(agent: Agent, messages: list[Message], model: str) -> Reply:
    """The reply the agent's script gives; the local Messages API server serves the same."""
    content = agent.script(Conversation(input=input_from_messages(messages), messages=messages))
    uses_tools = any(block["type"] == "tool_use" for block in content)
    return {
        "id": f"msg_scripted_{len(messages):04d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if uses_tools else "end_turn",
        "usage": {
            "input_tokens": _estimate_tokens(agent.system, messages),
            "output_tokens": _estimate_tokens("", [{"role": "assistant", "content": content}]),
        },
    }


def _estimate_tokens(system: str, messages: list[Message]) -> int:
    """About four characters a token, so budgets behave the same without a real model."""
    return max(1, (len(system) + len(json.dumps(messages))) // 4)


@cache
def model_for(settings: Settings) -> Model:
    """One adapter per process and settings: the SDK client keeps its connection pool."""
    if settings.anthropic_api_key:
        return AnthropicModel(settings)
    return ScriptedModel()
