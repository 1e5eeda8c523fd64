"""Running one tool call through the journal: validate, execute (or replay), record."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

import pipeline.instruments as instruments
from pipeline.agent import Agent, Block
from pipeline.crash import crash_point
from pipeline.db import transaction
from pipeline.engine import artifacts
from pipeline.engine import journal as jr
from pipeline.engine.actions import TOOL_RETRY, perform, record_proposal
from pipeline.engine.leases import Lease
from pipeline.engine.once import JournalOnce
from pipeline.engine.timers import await_timer
from pipeline.errors import PermanentError, TemporaryError, redact_urls
from pipeline.logs import get_logger
from pipeline.retry import call_with_retries
from pipeline.settings import Settings
from pipeline.tools import ArtifactRequest, Tool, ToolContext, ToolOutput, once_scope

log = get_logger("nightshift.tools")

# Merge into state.artifacts without rewriting the rest of the run's state.
_ADD_ARTIFACT_REF = text(
    """
    UPDATE runs
       SET state = jsonb_set(state, '{artifacts}',
                             coalesce(state->'artifacts', '{}'::jsonb) || CAST(:ref AS jsonb))
     WHERE id = :run_id
    """
)


@dataclass(frozen=True)
class ToolCall:
    lease: Lease
    run_id: uuid.UUID
    agent: str
    step: int
    run_input: dict[str, Any]
    block: Block
    """The model's tool_use block: id, name, input."""
    last: bool = False
    """The reply's last call: its result is journaled with the step's checkpoint, in one
    transaction (a crash before that commit runs it again: a read-only tool is rerun, a side
    effect is found in its action's row)."""

    @property
    def key(self) -> str:
        return jr.tool_key(self.block["id"])


def run_tool_call(
    call: ToolCall,
    agent: Agent,
    journal: jr.Journal,
    settings: Settings,
    keep_going: Callable[[], None],
) -> dict[str, Any]:
    """The journaled result payload of this tool call, executing it only if not journaled yet."""
    name = call.block["name"]
    tool = agent.tool(name)
    label = name if tool is not None else "(unknown)"  # the model may name any tool
    journaled = journal.replay(call.key, name)
    if journaled is not None:
        log.info("%s replayed from the journal", name)
        instruments.TOOL_CALLS.labels(call.agent, label, "replayed").inc()
        return journaled
    started = time.perf_counter()
    payload = _call(call, tool, journal, settings, keep_going)
    result = "error" if payload["is_error"] else "ok"
    instruments.TOOL_CALLS.labels(call.agent, label, result).inc()
    instruments.TOOL_SECONDS.labels(call.agent, label).observe(time.perf_counter() - started)
    return payload


def _call(
    call: ToolCall,
    tool: Tool | None,
    journal: jr.Journal,
    settings: Settings,
    keep_going: Callable[[], None],
) -> dict[str, Any]:
    name = call.block["name"]
    if tool is None:
        return _record(call, journal, settings, error=f"unknown tool {name!r}")
    problems = tool.argument_errors(call.block.get("input"))
    if problems:
        return _record(call, journal, settings, error="invalid arguments: " + "; ".join(problems))
    if tool.wake_time is not None:
        await_timer(tool, call.block, call.lease, call.step, journal)
    context = ToolContext(
        call.run_id, call.agent, call.block["id"], settings, call.run_input, keep_going=keep_going
    )
    try:
        with once_scope(JournalOnce(call.lease, journal, call.step)):
            output = _execute(tool, call, context)
    except (PermanentError, TemporaryError) as exc:
        error = _scrub(settings, f"{name} failed: {exc}")
        log.warning("tool %s", error)
        return _record(call, journal, settings, error=error)
    return _record(call, journal, settings, output=output)


def record_proposals(
    calls: list[ToolCall], agent: Agent, journal: jr.Journal, settings: Settings
) -> None:
    """Before any call of a reply runs: record each approval-requiring one as pending, so the
    run that parks on the first still shows the approver all of them."""

    for call in calls:
        tool = agent.tool(call.block["name"])
        if tool is None or not tool.requires_approval or tool.side_effect is None:
            continue
        if journal.replay(call.key, tool.name) is not None:
            continue
        if tool.argument_errors(call.block.get("input")):
            continue
        context = ToolContext(call.run_id, call.agent, call.block["id"], settings, call.run_input)
        record_proposal(tool, call, context)


def _execute(tool: Tool, call: ToolCall, context: ToolContext) -> ToolOutput:
    if tool.has_side_effects:
        return perform(tool, call, context)
    if tool.requires_approval:
        # Defence in depth (tools.py refuses this at definition time): only the action protocol
        # records an approval and waits for it, so without a side effect nothing would.
        log.error("tool %s requires approval but declares no side effect; not run", tool.name)
        raise PermanentError(
            f"{tool.name} requires approval but declares no side effect, so no approval could "
            "be recorded; it was not run"
        )
    return call_with_retries(
        lambda: tool.run(call.block["input"], context), TOOL_RETRY, before_retry=context.keep_going
    )


def _record(
    call: ToolCall,
    journal: jr.Journal,
    settings: Settings,
    *,
    output: ToolOutput | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """Journal the result (an artifact if large) and count the tool call, in one fenced write."""
    artifact: tuple[dict[str, Any], str] | None = None
    if error is not None:
        content = _scrub(settings, error)
    elif isinstance(output, ArtifactRequest):
        ref = artifacts.write_file(settings.artifact_dir, call.run_id, output.name, output.content)
        artifact = (ref, output.media_type)
        content = json.dumps({"artifact": ref})
    else:
        content = output if isinstance(output, str) else json.dumps(output, sort_keys=True)
        content = settings.config.redact(content)
        if len(content.encode()) > settings.artifact_threshold_bytes:
            name = call.block["name"]
            ref = artifacts.write_file(settings.artifact_dir, call.run_id, name, content)
            artifact = (ref, "application/json")
            content = artifacts.preview(content, ref)
    payload = {
        "tool_use_id": call.block["id"],
        "name": call.block["name"],
        "content": content,
        "is_error": error is not None,
    }
    if call.last and artifact is None:
        journal.defer(call.key, call.step, call.block["name"], payload)
        return payload
    with transaction() as session:
        journal.append_fenced_txn(
            session, call.lease, call.key, call.step, call.block["name"], payload
        )
        if artifact is not None:
            ref, media_type = artifact
            artifacts.record_txn(session, call.run_id, ref, media_type)
            session.execute(
                _ADD_ARTIFACT_REF, {"run_id": call.run_id, "ref": json.dumps({ref["name"]: ref})}
            )
    crash_point("after_tool_journaled")
    return payload


def _scrub(settings: Settings, error: str) -> str:
    """A tool's own error may name a URL with its token, or a secret setting's value."""
    return settings.config.redact(redact_urls(error))
