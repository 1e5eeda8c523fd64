"""What pipeline.testing records of a run (tool calls, actions) and what a test hands it
(stubs, canned model replies)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from models import ActionState
from pipeline.agent_definition import Agent, Block, Message, text
from pipeline.engine.llm import Reply, reply_of
from pipeline.errors import Conflict
from pipeline.tools import ToolContext, ToolOutput

Stub = Callable[[dict[str, Any], ToolContext], ToolOutput] | ToolOutput
"""A tool's stand-in: its result, or a function of (arguments, context) returning it."""
CannedReply = list[Block] | str | Reply
"""A model reply: its content blocks, a text, or a whole reply (a `stop_reason` of its own)."""
NOT_SENT = "recorded by pipeline.testing, not sent"


class KeyNotStable(Conflict, AssertionError):
    """A side effect's key changed between two computations of one call (an AssertionError
    too, so pytest reports it as the test's failure)."""


@dataclass(frozen=True)
class Call:
    """One tool call of the run and what the model got back (its journaled result)."""

    id: str
    step: int
    name: str
    args: dict[str, Any]
    content: str
    is_error: bool

    @property
    def result(self) -> Any:
        """The content as JSON, when it is (a tool's dict result), else the text."""
        try:
            return json.loads(self.content)
        except ValueError:
            return self.content


@dataclass
class Action:
    """A side effect the run recorded under its idempotency key, as the actions table would."""

    key: str
    tool: str
    service: str
    args: dict[str, Any]
    """As recorded: what an approver sees and what a send gets."""
    requires_approval: bool
    approvers: tuple[str, ...]
    state: ActionState
    calls: list[str] = field(default_factory=list)
    """The tool calls that meant it (a second call with its key gets the first's outcome)."""
    sends: int = 0
    """How many times its stub was called as the send: 0 (no stub, rejected) or 1."""
    result: dict[str, Any] | None = None
    decided_by: str | None = None
    note: str | None = None


class CannedModel:
    """Model replies given by the test, in order, shaped as the scripted model shapes them."""

    name = "canned"

    def __init__(self, replies: Iterable[CannedReply]) -> None:
        self._replies = list(replies)
        self._asked = 0

    def reply(self, agent: Agent, messages: list[Message], *, max_tokens: int) -> Reply:
        if self._asked >= len(self._replies):
            raise AssertionError(
                f"the run asked the model for reply {self._asked + 1}; replies= gave "
                f"{len(self._replies)}"
            )
        canned = self._replies[self._asked]
        self._asked += 1
        if isinstance(canned, dict):
            return {
                **reply_of(canned.get("content", []), agent.system, messages, self.name),
                **canned,
            }
        content = [text(canned)] if isinstance(canned, str) else canned
        return reply_of(content, agent.system, messages, self.name)


def stubbed(stub: Stub, args: dict[str, Any], context: ToolContext) -> ToolOutput:
    output = stub(args, context) if callable(stub) else stub
    return output.model_dump(mode="json") if isinstance(output, BaseModel) else output
