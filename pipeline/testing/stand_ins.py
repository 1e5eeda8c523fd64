"""The agent a test runs: the test's stubs in place of its tools (a side effect's stub stands in
for its service), each side effect's key computed twice, and canned replies as its script. It is
a value like any agent, so the real step runs it; what it saw is kept in a `Recorder`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pydantic import BaseModel

from pipeline.agent_definition import Agent, Block, Conversation, text
from pipeline.errors import InvalidInput, RunStopped
from pipeline.testing.records import CannedReply, KeyNotStable, Stub
from pipeline.tools import Tool, ToolContext, ToolOutput

NOT_SENT = "recorded by pipeline.testing, not sent"
TEST_FAILED = "test_failed"
"""The stop reason of a run the test itself stopped (a key not stable, replies run out)."""


@dataclass
class Recorder:
    """What the stand-ins saw in one run."""

    sends: Counter[str] = field(default_factory=Counter)
    """Stub calls as a side effect's send, by idempotency key."""
    keys: dict[str, str] = field(default_factory=dict)
    """Each side-effecting tool call's idempotency key, by tool_use_id."""
    failures: list[AssertionError] = field(default_factory=list)
    """What fails the test (raised once the run stops)."""

    def fail(self, failure: AssertionError) -> RunStopped:
        """Keep the failure for the test; stop the run before anything more is done."""
        self.failures.append(failure)
        return RunStopped(TEST_FAILED, str(failure))


class _NotStubbed:
    def __repr__(self) -> str:
        return "not stubbed"


NOT_STUBBED: Any = _NotStubbed()


@dataclass(frozen=True)
class StandIn(Tool):
    """A tool as a test runs it: its stub instead of its function (a side effect with no stub
    sends nothing), and its key computed twice for every call."""

    stub: Any = field(default=NOT_STUBBED, compare=False)
    recorder: Recorder = field(default_factory=Recorder, compare=False, repr=False)

    def run(self, args: dict[str, Any], context: ToolContext) -> ToolOutput:
        if self.stub is NOT_STUBBED:
            return {"sent": False, "idempotency_key": context.idempotency_key, "note": NOT_SENT}
        if self.side_effect is not None:
            self.recorder.sends[context.idempotency_key or ""] += 1
        output = self.stub(args, context) if callable(self.stub) else self.stub
        return output.model_dump(mode="json") if isinstance(output, BaseModel) else output

    def action_key(self, args: dict[str, Any], context: ToolContext) -> str:
        """As a worker computes it, twice: on the proposal, the send and every replay. A key
        that follows a clock, a counter or a random id fails the test before anything is
        sent, since a retried run could not be told from a new one."""
        first = super().action_key(args, context)
        again = super().action_key(args, context)
        known = self.recorder.keys.setdefault(context.tool_use_id, first)
        if first == again == known:
            return first
        seen = [known, *(k for k in (first, again) if k != known)]
        raise self.recorder.fail(
            KeyNotStable(
                f"{self.name}'s idempotency key changed between two computations of one call "
                f"({seen[0]!r}, then {seen[1]!r}): the key must follow from what the action "
                "means (its arguments, the run's input), or a retried run sends it again"
            )
        )


def stand_in_agent(
    agent: Agent,
    stubs: Mapping[str, Stub],
    replies: Iterable[CannedReply] | None,
    recorder: Recorder,
) -> Agent:
    """`agent` with each stubbed tool and each side effect standing in (a stand-in needs no
    setting: `needs` is for the service it replaces), and `replies` as its script."""
    unknown = sorted(set(stubs) - {t.name for t in agent.tools})
    if unknown:
        raise InvalidInput(f"tools= stubs {unknown[0]!r}, which {agent.name} does not have")
    tools = tuple(
        _stand_in(t, stubs.get(t.name, NOT_STUBBED), recorder)
        if t.name in stubs or t.has_side_effects
        else t
        for t in agent.tools
    )
    changed = replace(agent, tools=tools)
    if replies is not None:
        changed = replace(changed, script=CannedScript(list(replies), recorder))
    return changed


def _stand_in(tool: Tool, stub: Any, recorder: Recorder) -> StandIn:
    kept = {f.name: getattr(tool, f.name) for f in fields(Tool) if f.init}
    return StandIn(**{**kept, "needs": ()}, stub=stub, recorder=recorder)


class CannedScript:
    """The test's replies, in order: reply N answers the conversation with N replies so far."""

    def __init__(self, replies: list[CannedReply], recorder: Recorder) -> None:
        self.replies = replies
        self.recorder = recorder

    def __call__(self, conversation: Conversation) -> list[Block]:
        asked = conversation.assistant_turns()
        if asked >= len(self.replies):
            raise self.recorder.fail(
                AssertionError(
                    f"the run asked the model for reply {asked + 1}; replies= gave "
                    f"{len(self.replies)}"
                )
            )
        reply = self.replies[asked]
        return [text(reply)] if isinstance(reply, str) else list(reply)
