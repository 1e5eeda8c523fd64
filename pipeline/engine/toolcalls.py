"""Running one tool call through the journal: validate, execute (or replay), record."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pipeline.instruments as instruments
import pipeline.tracing as tracing
from pipeline.agent_definition import Agent, Block
from pipeline.crash import crash_point
from pipeline.engine import action_rows as rows
from pipeline.engine import artifacts, dispatch, drift, step_sql
from pipeline.engine import journal as jr
from pipeline.engine.actions import TOOL_RETRY, perform, record_proposal
from pipeline.engine.leases import Lease, fenced
from pipeline.engine.once_journal import JournalOnce
from pipeline.engine.state_replay import JOURNALED, StepState
from pipeline.engine.timers import await_timer
from pipeline.engine.versions import StepVersion
from pipeline.errors import LeaseLost, PermanentError, TemporaryError
from pipeline.logs import get_logger
from pipeline.retry import call_with_retries
from pipeline.settings import Settings
from pipeline.tools import AgentState, Tool, ToolContext, ToolOutput, once_scope

log = get_logger("nightshift.tools")


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
    replayed: bool = False
    """Its model reply came from the journal: an earlier attempt of this step wrote it."""
    version: StepVersion | None = None
    """The agent version this step runs under (None: a caller outside a step)."""
    batch_id: str | None = None
    """The batch the run belongs to, as the fan-out recorded it (ToolContext.batch_id)."""

    @property
    def drifted(self) -> bool:
        """Written under an earlier agent version, or under one a person allowed since: what
        it names may no longer be what this version has."""
        changed = self.version is not None and (self.version.changed or self.version.allowed)
        return self.replayed and changed

    @property
    def key(self) -> str:
        return jr.tool_key(self.block["id"])


def run_tool_call(
    call: ToolCall,
    agent: Agent,
    journal: jr.Journal,
    settings: Settings,
    keep_going: Callable[[], None],
    state: StepState,
) -> dict[str, Any]:
    """The journaled result payload of this tool call, executing it only if not journaled yet;
    `state` follows the agent state the call left (run now, or replayed)."""
    name = call.block["name"]
    tool = agent.tool(name)
    label = name if tool is not None else "(unknown)"  # the model may name any tool
    journaled = journal.replay(call.key, name)
    if call.drifted and journaled is None:
        drift.check_replayed_call(call, tool)
    elif call.drifted:
        drift.check_replayed_result(call, tool)
    if journaled is not None:
        log.info("%s replayed from the journal", name)
        instruments.TOOL_CALLS.labels(call.agent, label, "replayed").inc()
        state.follow(journaled)
        return journaled
    started = time.perf_counter()
    with tracing.tool_call(label, call.block["id"]):
        payload = _call(call, tool, journal, settings, keep_going, state)
        tracing.mark({"nightshift.tool.is_error": bool(payload["is_error"])})
    state.follow(payload)
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
    state: StepState,
) -> dict[str, Any]:
    name = call.block["name"]
    if tool is None:
        unknown = drift.removed(call) if call.drifted else dispatch.unknown_tool(name)
        return _record(call, journal, settings, error=unknown)
    invalid = dispatch.invalid_arguments(tool, call.block.get("input"))
    if invalid and not (call.drifted and _has_action(call, tool)):
        return _record(call, journal, settings, error=invalid)
    if tool.wake_time is not None:
        await_timer(tool, call.block, call.lease, call.step, journal)
    seen = state.for_call()
    context = replace(_context(call, settings, seen), keep_going=keep_going)
    onces = JournalOnce(call.lease, journal, call.step, call.block["id"], drift.once_mismatch(call))
    try:
        with once_scope(onces):
            output = _execute(tool, call, context)
        onces.finish()
    except (PermanentError, TemporaryError) as exc:
        error = dispatch.failure(settings, name, exc)
        log.warning("tool %s", error)
        return _record(call, journal, settings, error=error)
    return _record(call, journal, settings, output=output, state=state.changed_by(seen))


def _has_action(call: ToolCall, tool: Tool) -> bool:
    """An earlier release recorded this call's action: it is settled through that one, with
    its recorded arguments, whatever this release's schema says of them."""
    return tool.has_side_effects and rows.of_call(call.lease, call.block["id"]) is not None


def record_proposals(
    calls: list[ToolCall], agent: Agent, journal: jr.Journal, settings: Settings, state: StepState
) -> None:
    """Before any call of a reply runs: record each approval-requiring one as pending, so the
    run that parks on the first still shows the approver all of them."""

    for call in calls:
        tool = agent.tool(call.block["name"])
        if tool is None or not dispatch.awaits_approval(tool):
            continue
        if journal.replay(call.key, tool.name) is not None:
            continue
        if dispatch.invalid_arguments(tool, call.block.get("input")):
            continue
        context = _context(call, settings, state.for_call())
        record_proposal(tool, call, context)


def _context(call: ToolCall, settings: Settings, state: AgentState) -> ToolContext:
    return dispatch.context_for(
        call.run_id, call.agent, call.block, settings, call.run_input, batch_id=call.batch_id,
        state=state,
    )  # fmt: skip


def _execute(tool: Tool, call: ToolCall, context: ToolContext) -> ToolOutput:
    if tool.has_side_effects:
        return perform(tool, call, context)
    refused = dispatch.unrunnable(tool)
    if refused is not None:
        log.error("tool %s requires approval but declares no side effect; not run", tool.name)
        raise refused
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
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Journal the result (an artifact if large) and count the tool call, in one fenced write;
    `state`: the agent state the call left, journaled with its result unless that is an error
    (a failed call changes nothing)."""
    artifact: artifacts.Pending | None = None
    if error is None:
        try:
            content, artifact = dispatch.result_content(
                call.run_id, call.block["name"], output, settings
            )
        except artifacts.ArtifactTooLarge as exc:
            error = f"{call.block['name']}: {exc}"
            log.warning("tool %s", error)
    if error is not None:
        content = dispatch.scrub(settings, error)
    payload = dispatch.result_payload(call.block, content, is_error=error is not None)
    if error is None and state is not None:
        payload[JOURNALED] = state
    name, lease = call.block["name"], call.lease
    if artifact is not None:  # the artifact and its entry in one fenced transaction
        with fenced(lease) as session:
            journal.append_txn(session, call.key, call.step, name, payload)
            artifacts.store_txn(session, artifact)
            crash_point("before_artifact_committed")
    elif call.last:
        journal.defer(call.key, call.step, name, payload)
        return payload
    elif step_sql.journal_entry(lease.run_id, lease.fence, call.key, call.step, name, payload):
        journal.remember(call.key, call.step, name, payload)
    else:
        raise LeaseLost(f"run {lease.run_id}: fence {lease.fence} is no longer current")
    crash_point("after_tool_journaled")
    return payload
