"""What a step decides about a model reply, with no database: which tool each call names and
whether it may run, its action's idempotency key and record, whether it waits for an
approval, what a refusal says, and the journal's shape of a tool result and of a run's answer.

The step (engine/step.py, toolcalls.py, actions.py) makes these decisions through these
functions and adds the durable part around them (fence, action rows, sends, reconciliation).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from models import ActionState
from pipeline.agent_definition import Block, Conversation
from pipeline.engine import artifacts
from pipeline.errors import NightshiftError, PermanentError, redact_urls
from pipeline.keys import check_key
from pipeline.settings import Settings
from pipeline.tools import AgentState, ArtifactRequest, Tool, ToolContext, ToolOutput

SUCCESS_CHECK_NOTE = (
    "The success check failed: the task is not finished yet. Keep going and complete it."
)
"""What the model reads after a final answer the agent's success check refused."""

COUNTED = (
    ActionState.PENDING_APPROVAL,
    ActionState.INTENDED,
    ActionState.ATTEMPTED,
    ActionState.OUTCOME_UNKNOWN,
    ActionState.CONFIRMED,
)
"""A run's actions that count against its cap: sent, maybe sent, or still to be sent."""


@dataclass(frozen=True)
class NewAction:
    """What a tool call would record under its key."""

    key: str
    run_id: uuid.UUID
    tool_use_id: str
    tool: str
    service: str
    args: dict[str, Any]
    requires_approval: bool
    approvers: tuple[str, ...]
    cap: int | None = None
    """The most actions of this service the run may record (SideEffect.per_run_cap)."""

    @property
    def first_state(self) -> ActionState:
        return ActionState.PENDING_APPROVAL if self.requires_approval else ActionState.INTENDED


def tool_uses(reply: dict[str, Any]) -> list[Block]:
    """The reply's tool calls, in the order the model wrote them."""
    return [b for b in reply["content"] if b["type"] == "tool_use"]


def continues(reply: dict[str, Any]) -> bool:
    """Whether the run goes on to another step after this reply (tools ran, or a paused turn
    the model continues); otherwise the reply is the run's answer."""
    return bool(tool_uses(reply)) or reply.get("stop_reason") == "pause_turn"


def unknown_tool(name: str) -> str:
    return f"unknown tool {name!r}"


def invalid_arguments(tool: Tool, args: object) -> str | None:
    """The error the model reads for arguments the tool's schema refuses; None when valid."""
    problems = tool.argument_errors(args)
    return "invalid arguments: " + "; ".join(problems) if problems else None


def awaits_approval(tool: Tool | None) -> bool:
    """A call of this tool is recorded as pending and sent only once a person approves it."""
    return tool is not None and tool.requires_approval and tool.side_effect is not None


def unrunnable(tool: Tool) -> PermanentError | None:
    """Why a tool without a side effect cannot run (defence in depth: Tool refuses this at
    definition time): only the action protocol records an approval and waits for it."""
    if tool.has_side_effects or not tool.requires_approval:
        return None
    return PermanentError(
        f"{tool.name} requires approval but declares no side effect, so no approval could "
        "be recorded; it was not run"
    )


def context_for(
    run_id: uuid.UUID,
    agent: str,
    block: Block,
    settings: Settings,
    run_input: dict[str, Any],
    *,
    batch_id: str | None = None,
    state: AgentState | None = None,
) -> ToolContext:
    """What the tool (and its key, check and lookup) gets for this call; `state`: the agent
    state as the calls before it left it (none: an empty one)."""
    return ToolContext(
        run_id, agent, block["id"], settings, run_input, batch_id=batch_id,
        state=state if state is not None else AgentState(max_bytes=settings.agent_state_max_bytes),
    )  # fmt: skip


def action_key(tool: Tool, args: dict[str, Any], context: ToolContext) -> str:
    """The call's idempotency key, checked (a bad one is the tool's permanent error)."""
    try:
        return check_key(tool.action_key(args, context), what=f"{tool.name}'s idempotency key")
    except NightshiftError as exc:
        raise PermanentError(str(exc)) from None


def new_action(
    run_id: uuid.UUID, block: Block, tool: Tool, key: str, settings: Settings
) -> NewAction:
    """What the call records under its key before anything is sent."""
    effect = tool.side_effect
    assert effect is not None, f"{tool.name} has no side effect declared"
    return NewAction(
        key=key,
        run_id=run_id,
        tool_use_id=block["id"],
        tool=tool.name,
        service=effect.service,
        args=block["input"],
        requires_approval=tool.requires_approval,
        approvers=settings.approvers_for(tool.name, tool.approvers),
        cap=effect.cap(settings),
    )


def cap_refusal(new: NewAction, used: int) -> PermanentError | None:
    """The refusal of a new action past its run's cap for the service (`used`: the run's
    other actions of it), or None."""
    if new.cap is None or used < new.cap:
        return None
    return PermanentError(
        f"refused: this run already has {used} {new.service} action(s), its cap "
        f"({new.cap} a run, set by the deployment); nothing was sent"
    )


def carries_on(tool: Tool, recorded_tool: str, recorded_approval: bool) -> bool:
    """Whether a call may carry on with an action its own run recorded under the same key:
    only the same tool, and never skipping an approval the tool now requires."""
    return recorded_tool == tool.name and (recorded_approval or not tool.requires_approval)


def rejected_result(decided_by: str | None, note: str | None) -> str:
    """What the model reads for an action a person rejected."""
    who, why = decided_by or "a person", note or "no reason given"
    return f"Not done: {who} rejected this action ({why})."


def failure(settings: Settings, name: str, exc: Exception) -> str:
    """The error the model reads for a tool that failed (after its retries)."""
    return scrub(settings, f"{name} failed: {exc}")


def scrub(settings: Settings, error: str) -> str:
    """A tool's own error may name a URL with its token, or a secret setting's value."""
    return settings.config.redact(redact_urls(error))


def result_content(
    run_id: uuid.UUID,
    name: str,
    output: ToolOutput | None,
    settings: Settings,
) -> tuple[str, artifacts.Pending | None]:
    """The journaled text of a tool's output (secret settings' values redacted), and the
    artifact it is kept as: a report, or an output over NIGHTSHIFT_ARTIFACT_THRESHOLD_BYTES
    (ArtifactTooLarge past NIGHTSHIFT_ARTIFACT_MAX_BYTES)."""
    limit = settings.artifact_max_bytes
    if isinstance(output, ArtifactRequest):
        kept = artifacts.prepare(run_id, output.name, output.content, output.media_type, limit)
        return json.dumps({"artifact": kept.ref}), kept
    content = output if isinstance(output, str) else json.dumps(output, sort_keys=True)
    content = settings.config.redact(content)
    if len(content.encode()) <= settings.artifact_threshold_bytes:
        return content, None
    kept = artifacts.prepare(run_id, name, content, "application/json", limit)
    return artifacts.preview(content, kept.ref), kept


def result_payload(block: Block, content: str, *, is_error: bool) -> dict[str, Any]:
    """The journal entry of a tool call's result (`tool:<id>`), as the model gets it back."""
    return {
        "tool_use_id": block["id"],
        "name": block["name"],
        "content": content,
        "is_error": is_error,
    }


def answer(conversation: Conversation, reply: dict[str, Any]) -> dict[str, Any]:
    """The result of a run that ends on this reply."""
    result = {"text": conversation.last_text(), "state": conversation.state}
    if reply.get("stop_sequence"):
        result["stop_sequence"] = reply["stop_sequence"]
    return result
