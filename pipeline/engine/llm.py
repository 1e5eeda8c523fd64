"""Model adapters. Both return the reply as a plain dict in the Messages API's shape."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

from pipeline.agent_definition import Agent, Block, Conversation, Message, input_from_messages
from pipeline.engine.usage import SCRIPTED_MODEL
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

    name = SCRIPTED_MODEL

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
    return reply_of(content, agent.system, messages, model)


def reply_of(content: list[Block], system: str, messages: list[Message], model: str) -> Reply:
    """A reply in the Messages API's shape for content a stand-in wrote (a script, a test's
    canned reply): its stop reason from its blocks, its usage estimated from its length."""
    uses_tools = any(block["type"] == "tool_use" for block in content)
    return {
        "id": f"msg_scripted_{len(messages):04d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if uses_tools else "end_turn",
        "usage": {
            "input_tokens": _estimate_tokens(system, messages),
            "output_tokens": max(
                1, len(json.dumps([{"role": "assistant", "content": content}])) // 4
            ),
        },
    }


def estimate_request_tokens(agent: Agent, messages: list[Message]) -> int:
    """A request's whole prompt (tools, system, messages) at four characters a token, before
    it is sent (rate limits charge it); never less than the local Messages API counts."""
    tools = len(json.dumps([t.spec() for t in agent.tools])) // 4 if agent.tools else 0
    return tools + _estimate_tokens(agent.system, messages)


def _estimate_tokens(system: str, messages: list[Message]) -> int:
    """About four characters a token, so budgets behave the same without a real model:
    len(json.dumps(messages)), added up from each message's own length ('[', ', ' between)."""
    dumped = 2 + _SIZES.total(messages) + 2 * max(0, len(messages) - 1)
    return max(1, (len(system) + dumped) // 4)


@dataclass(frozen=True)
class _Prefix:
    message: Message
    previous: Message | None
    total: int
    """len(json.dumps(m)) summed over the conversation up to and including `message`."""


class _ConversationSizes:
    """Per process: the summed json.dumps lengths of the conversations seen lately, by the
    identity of their last message and the one before it. A run's conversation is rebuilt from
    the journal's cached entries, the same objects each step and never changed, so a step
    measures only its new messages instead of the whole history (flat cost at step 1,000)."""

    def __init__(self, kept: int = 8192) -> None:
        self._kept = kept
        self._known: OrderedDict[int, _Prefix] = OrderedDict()
        self._lock = threading.Lock()

    def total(self, messages: list[Message]) -> int:
        start, total = self._longest_known(messages)
        found = []
        for i in range(start, len(messages)):
            total += len(json.dumps(messages[i]))
            found.append(_Prefix(messages[i], messages[i - 1] if i else None, total))
        with self._lock:
            for prefix in found:
                # The entry holds its message (and the one before), so neither id is reused
                # while it is in here.
                self._known[id(prefix.message)] = prefix
            while len(self._known) > self._kept:
                self._known.popitem(last=False)
        return total

    def _longest_known(self, messages: list[Message]) -> tuple[int, int]:
        """(index of the first message not covered, total of those before it)."""
        with self._lock:
            for i in range(len(messages) - 1, -1, -1):
                known = self._known.get(id(messages[i]))
                previous = messages[i - 1] if i else None
                if known and known.message is messages[i] and known.previous is previous:
                    self._known.move_to_end(id(messages[i]))
                    return i + 1, known.total
        return 0, 0


_SIZES = _ConversationSizes()


def load_sdk(settings: Settings) -> None:
    """Import the SDK at a worker's start when its runs call the model: a prefork worker's pool
    children then fork with it loaded. Each child paid the import in its first step (~0.7 s,
    2-10 s on a loaded machine), and after a pool child dies, its replacement often runs the
    step resumed from it."""
    if settings.anthropic_api_key:
        import anthropic  # noqa: F401


@cache
def model_for(settings: Settings) -> Model:
    """One adapter per process and settings: the SDK client keeps its connection pool."""
    if settings.anthropic_api_key:
        return AnthropicModel(settings)
    return ScriptedModel()
