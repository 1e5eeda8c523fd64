"""Model adapters. Both return the reply as a plain dict in the Messages API's shape."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from functools import cache
from typing import Any, Protocol

from pipeline.agent import Agent, Conversation, Message, input_from_messages
from pipeline.errors import PermanentError
from pipeline.settings import Settings

Reply = dict[str, Any]


class Model(Protocol):
    name: str

    def reply(self, agent: Agent, messages: list[Message], *, max_tokens: int) -> Reply:
        """One model call. Raises on failure; the caller classifies and retries."""


class AnthropicModel:
    """The real Messages API through the `anthropic` SDK; nightshift owns the retries."""

    def __init__(self, settings: Settings) -> None:
        import anthropic  # lazy: ~0.7 s to import, and only runs with ANTHROPIC_API_KEY need it

        self.name = settings.model_name
        self._caching = settings.prompt_caching
        self._client = anthropic.Anthropic(
            api_key=settings.anthropic_api_key,
            base_url=settings.anthropic_base_url,
            max_retries=0,
            timeout=settings.model_timeout_seconds,
        )

    def reply(self, agent: Agent, messages: list[Message], *, max_tokens: int) -> Reply:
        request = request_for(agent, messages, max_tokens=max_tokens, caching=self._caching)
        message = self._client.messages.create(model=self.name, **request)
        return message.model_dump(mode="json", exclude_none=True)


CACHE_POINT = {"type": "ephemeral"}


def request_for(
    agent: Agent, messages: list[Message], *, max_tokens: int, caching: bool
) -> dict[str, Any]:
    """The Messages API request of one step, with prompt-cache breakpoints when `caching`.

    The prefix is tools, then system, then messages. Breakpoints: the system prompt (tools and
    system never change within a run), the last message (this call writes the conversation so
    far) and the last message but two (what the previous call wrote, so this call reads it
    even when the API looks back no further than a breakpoint's 20 blocks).
    """
    request: dict[str, Any] = {
        "max_tokens": max_tokens,
        "system": agent.system,
        "messages": messages,
        "tools": [t.spec() for t in agent.tools],
    }
    if agent.stop_sequences:
        request["stop_sequences"] = list(agent.stop_sequences)
    if not caching:
        return request
    request["system"] = [{"type": "text", "text": agent.system, "cache_control": CACHE_POINT}]
    marked = list(messages)
    for index in {len(marked) - 1, len(marked) - 3}:
        if index >= 0:
            marked[index] = _with_cache_point(marked[index])
    request["messages"] = marked
    return request


def _with_cache_point(message: Message) -> Message:
    """A copy whose last block carries a breakpoint (the journal's own blocks stay untouched)."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    if not blocks or (blocks[-1].get("type") == "text" and not blocks[-1].get("text")):
        return message  # the API refuses a breakpoint on an empty text block
    blocks[-1] = {**blocks[-1], "cache_control": CACHE_POINT}
    return {**message, "content": blocks}


class ScriptedModel:
    """A deterministic stand-in that answers with each agent's script (no network, no key)."""

    name = "scripted"

    def reply(self, agent: Agent, messages: list[Message], *, max_tokens: int) -> Reply:
        return scripted_reply(agent, messages, model=self.name)


def scripted_reply(agent: Agent, messages: list[Message], model: str) -> Reply:
    """The reply the agent's script gives; the local Messages API server serves the same."""
    if agent.script is None:
        # Starting such a run is refused without a key; this worker has none.
        raise PermanentError(
            f"agent {agent.name!r} has no script: it runs only on the real "
            "model, and ANTHROPIC_API_KEY is not set on this worker"
        )
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
    """About four characters a token, so budgets behave the same without a real model:
    len(json.dumps(messages)), added up from each message's own length ('[', ', ' between)."""
    dumped = 2 + sum(_SIZES.of(message) for message in messages) + 2 * max(0, len(messages) - 1)
    return max(1, (len(system) + dumped) // 4)


class _MessageSizes:
    """Per process: len(json.dumps(message)) of the messages seen lately, by identity. A run's
    conversation is rebuilt from the journal's cached entries, the same objects each step and
    never changed, so a step measures only its new messages instead of the whole history."""

    def __init__(self, kept: int = 8192) -> None:
        self._kept = kept
        self._sizes: OrderedDict[int, tuple[Message, int]] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, message: Message) -> int:
        with self._lock:
            known = self._sizes.get(id(message))
            if known is not None and known[0] is message:
                self._sizes.move_to_end(id(message))
                return known[1]
        size = len(json.dumps(message))
        with self._lock:
            # The message is held, so its id cannot be reused while it is in here.
            self._sizes[id(message)] = (message, size)
            while len(self._sizes) > self._kept:
                self._sizes.popitem(last=False)
        return size


_SIZES = _MessageSizes()


@cache
def model_for(settings: Settings) -> Model:
    """One adapter per process and settings: the SDK client keeps its connection pool."""
    if settings.anthropic_api_key:
        return AnthropicModel(settings)
    return ScriptedModel()
