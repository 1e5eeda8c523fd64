"""What pipeline.testing shows of a run (its tool calls, its actions) and what a test hands it
(stubs, canned model replies)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from models import ActionState
from pipeline.agent_definition import Block
from pipeline.errors import Conflict
from pipeline.tools import ToolContext, ToolOutput

Stub = Callable[[dict[str, Any], ToolContext], ToolOutput] | ToolOutput
"""A tool's stand-in: its result, or a function of (arguments, context) returning it."""
CannedReply = list[Block] | str
"""A model reply: its content blocks, or a text."""


# pipeline.testing's own failure (also an AssertionError for pytest), so it stays there.
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


@dataclass(frozen=True)
class Action:
    """A side effect the run recorded under its idempotency key: its row in the actions table
    when it was read."""

    key: str
    tool: str
    service: str
    args: dict[str, Any]
    """As recorded: what an approver sees and what a send gets."""
    requires_approval: bool
    approvers: tuple[str, ...]
    state: ActionState
    calls: tuple[str, ...]
    """The tool calls that meant it (a second call with its key gets the first's outcome)."""
    sends: int
    """How many times the tool's stub stood in for the service: 0 (no stub, or not sent) or 1."""
    result: dict[str, Any] | None
    decided_by: str | None
    note: str | None
