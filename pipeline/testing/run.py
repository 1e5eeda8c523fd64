"""A run of an agent in a test, in memory: StepRunner's decisions without its durable part
(the package's docstring says which functions it shares with the engine)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from models import ActionState, RunStatus
from pipeline.agent_definition import Agent, Block, Conversation, Message
from pipeline.engine import artifacts, dispatch, stops
from pipeline.engine import journal as jr
from pipeline.engine.actions import KEY_CONFLICT, TOOL_RETRY, ParkRun
from pipeline.engine.llm import Reply, ScriptedModel
from pipeline.engine.once_journal import ONCE_STEP, JournalOnce
from pipeline.errors import InvalidInput, NonDeterminism, PermanentError, RunStopped, TemporaryError
from pipeline.keys import approval_wait, conflict_wait, cut_key, model_key, note_key, person_wait
from pipeline.retry import call_with_retries, classify
from pipeline.runs.decisions import not_an_approver
from pipeline.settings import Settings, config_variable
from pipeline.testing.records import (
    NOT_SENT,
    Action,
    Call,
    CannedModel,
    CannedReply,
    KeyNotStable,
    Stub,
    stubbed,
)
from pipeline.tools import Tool, ToolContext, ToolOutput, once_scope


def run_agent(
    agent: Agent,
    run_input: dict[str, Any],
    *,
    tools: Mapping[str, Stub] | None = None,
    replies: Iterable[CannedReply] | None = None,
    config: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> AgentRun:
    """Run `agent` on `run_input` until it ends or parks (waiting for an approval).

    `tools`: stubs by tool name. `replies`: the model's replies in order, instead of the
    agent's script. `config`: tools' own settings (`{"oncall.web_url": ...}`, what
    `context.config` reads). `env`: nightshift's settings by variable, as a worker would have
    them (`{"NIGHTSHIFT_APPROVERS_MAIL_DIGEST": "alice"}`). The process environment is not
    read: a test sees only what it sets."""
    run = AgentRun(
        agent,
        run_input,
        tools=dict(tools or {}),
        model=ScriptedModel() if replies is None else CannedModel(replies),
        settings=_settings(config, env),
    )
    run._go()
    return run


def tool_context(
    agent: Agent,
    run_input: dict[str, Any],
    *,
    config: Mapping[str, str] | None = None,
    tool_use_id: str = "toolu_test",
) -> ToolContext:
    """The context a tool of `agent` gets in a run with this input, to call one tool directly:
    `mail_digest.action_key(args, tool_context(AGENT, RUN))`, `read_handover.run(...)`."""
    block = {"id": tool_use_id, "name": "", "input": {}}
    return dispatch.context_for(uuid.uuid4(), agent.name, block, _settings(config), run_input)


def _settings(config: Mapping[str, str] | None, env: Mapping[str, str] | None = None) -> Settings:
    variables = {config_variable(k): v for k, v in (config or {}).items()}
    return Settings.from_env({**(env or {}), **variables})


class AgentRun:
    """A run of an agent in a test, kept in memory; see the module's docstring."""

    def __init__(
        self,
        agent: Agent,
        run_input: dict[str, Any],
        *,
        tools: dict[str, Stub],
        model: ScriptedModel | CannedModel,
        settings: Settings,
    ) -> None:
        errors = agent.input_errors(run_input)
        if errors:
            raise InvalidInput(f"input for agent {agent.name!r} is invalid: " + "; ".join(errors))
        unknown = sorted(set(tools) - {t.name for t in agent.tools})
        if unknown:
            raise InvalidInput(f"tools= stubs {unknown[0]!r}, which {agent.name} does not have")
        self.id = uuid.uuid4()
        self.agent = agent
        self.input = run_input
        self.settings = settings
        self.status = RunStatus.RUNNING
        self.reason: str | None = None
        self.error: str | None = None
        self.result: dict[str, Any] | None = None
        self.waiting_on: str | None = None
        self.step = 0
        self.timers: list[tuple[str, datetime]] = []
        self.artifacts: dict[str, str] = {}
        self._stubs = tools
        self._model = model
        self._journal = jr.Journal(self.id, [], {})
        self._actions: dict[str, Action] = {}
        self._action_of_call: dict[str, Action] = {}

    # -- what a test reads ---------------------------------------------------------------------

    @property
    def answer(self) -> str:
        """The run's final text (empty until it succeeded)."""
        return (self.result or {}).get("text", "")

    @property
    def journal(self) -> list[jr.Entry]:
        return list(self._journal.entries)

    @property
    def calls(self) -> list[Call]:
        found = []
        for entry in self._journal.entries:
            if entry.step_name != jr.MODEL_STEP:
                continue
            for block in dispatch.tool_uses(entry.payload):
                result = self._journal.replay(jr.tool_key(block["id"]), block["name"])
                if result is not None:
                    found.append(
                        Call(
                            block["id"],
                            entry.step,
                            block["name"],
                            block["input"],
                            result["content"],
                            result["is_error"],
                        )
                    )
        return found

    @property
    def actions(self) -> list[Action]:
        return list(self._actions.values())

    @property
    def pending(self) -> list[Action]:
        return [a for a in self._actions.values() if a.state is ActionState.PENDING_APPROVAL]

    @property
    def messages(self) -> list[Message]:
        """The conversation so far, as the model sees it."""
        return self._journal.messages(self.agent, self.input, self.step + 1, remember=False)

    # -- what a person does --------------------------------------------------------------------

    def approve(self, key: str | None = None, *, by: str = "tester") -> AgentRun:
        """Approve the pending action (`key`: which, when several are) and go on with the run."""
        return self._decide(key, by, ActionState.INTENDED, None)

    def reject(
        self, key: str | None = None, *, by: str = "tester", note: str | None = None
    ) -> AgentRun:
        """Reject the pending action; the model reads why, and the run goes on."""
        return self._decide(key, by, ActionState.REJECTED, note)

    def _decide(self, key: str | None, by: str, state: ActionState, note: str | None) -> AgentRun:
        pending = [a for a in self.pending if key in (None, a.key)]
        if len(pending) != 1:
            keys = ", ".join(a.key for a in self.pending) or "none"
            raise AssertionError(f"which action? pending approval: {keys}")
        action = pending[0]
        refused = not_an_approver(action.key, by, action.approvers)
        if refused is not None:
            raise refused
        action.state, action.decided_by, action.note = state, by, note
        if self.waiting_on == str(approval_wait(action.key)):
            self.status, self.waiting_on = RunStatus.RUNNING, None
            self._go()
        return self

    # -- the steps -----------------------------------------------------------------------------

    def _go(self) -> None:
        while self.status is RunStatus.RUNNING:
            try:
                self._step()
            except ParkRun as park:
                self.status, self.waiting_on = park.status, park.waiting_on
                self.reason, self.error = park.reason or (None, None)
            except RunStopped as stopped:
                self._end(RunStatus.FAILED, stopped.reason, error=str(stopped))
            except NonDeterminism as exc:
                self._end(RunStatus.FAILED, "non_determinism", error=str(exc))
            except PermanentError as exc:
                self._end(RunStatus.FAILED, "model_error", error=f"model call failed: {exc}")

    def _end(self, status: RunStatus, reason: str, **what: Any) -> None:
        self.status, self.reason = status, reason
        self.error, self.result = what.get("error"), what.get("result")

    def _step(self) -> None:
        """StepRunner._step without its durable part: the same decisions, in the same order."""
        step, journal = self.step, self._journal
        if step >= self.agent.max_steps:
            return self._end(RunStatus.FAILED, "max_steps", error="stopped: max_steps")
        messages = journal.messages(self.agent, self.input, before_step=step)
        reply = self._reply(step, messages)
        stop = stops.stop_for_reply(reply)
        if stop is not None:
            raise stop
        uses = dispatch.tool_uses(reply)
        for block in uses:
            self._propose(block)
        for block in uses:
            self._call(block)
        journal.take_deferred()  # the checkpoint: in memory, there is nothing to write
        if dispatch.continues(reply):
            self.step += 1
            return None
        messages = journal.messages(self.agent, self.input, before_step=step + 1, remember=False)
        conversation = Conversation(input=self.input, messages=messages)
        if self.agent.check_success is not None and not self.agent.check_success(conversation):
            note = {"text": dispatch.SUCCESS_CHECK_NOTE}
            journal.defer(note_key(step), step, jr.NOTE_STEP, note)
            self.step += 1
            return None
        self._end(RunStatus.SUCCEEDED, "completed", result=dispatch.answer(conversation, reply))
        return None

    def _reply(self, step: int, messages: list[Message]) -> Reply:
        journaled = self._journal.replay(model_key(step), jr.MODEL_STEP)
        if journaled is not None:
            return journaled
        cut_offs = self._journal.cut_offs(step)
        while True:
            room = stops.room_for(
                self.agent.max_tokens, self.settings.max_tokens_cap, len(cut_offs)
            )
            if room is None:
                raise stops.cut_off_stop(step, cut_offs[-1]["max_tokens"])
            reply = self._model.reply(self.agent, messages, max_tokens=room)
            if not stops.is_cut_off(reply):
                break
            cut = {**reply, "max_tokens": room}
            self._journal.defer(cut_key(step, len(cut_offs)), step, jr.CUT_STEP, cut)
            cut_offs.append(cut)
        self._journal.defer(model_key(step), step, jr.MODEL_STEP, reply)
        return reply

    def _context(self, block: Block) -> ToolContext:
        return dispatch.context_for(self.id, self.agent.name, block, self.settings, self.input)

    def _propose(self, block: Block) -> None:
        """record_proposals: every approval-requiring call of the reply is pending at once."""
        tool = self.agent.tool(block["name"])
        if tool is None or not dispatch.awaits_approval(tool):
            return
        if self._journal.replay(jr.tool_key(block["id"]), tool.name) is not None:
            return
        if dispatch.invalid_arguments(tool, block.get("input")):
            return
        try:
            self._action_for(tool, block, self._context(block))
        except (PermanentError, TemporaryError):
            return  # the call itself reports it

    def _call(self, block: Block) -> None:
        name = block["name"]
        if self._journal.replay(jr.tool_key(block["id"]), name) is not None:
            return  # a replayed step (after an approval): the result is journaled
        tool = self.agent.tool(name)
        if tool is None:
            return self._record(block, error=dispatch.unknown_tool(name))
        invalid = dispatch.invalid_arguments(tool, block.get("input"))
        if invalid:
            return self._record(block, error=invalid)
        if tool.wake_time is not None:
            self.timers.append((name, tool.wake_time(block["input"], datetime.now(UTC))))
        step = self.step

        def keep(key: str, payload: dict[str, Any]) -> None:
            self._journal.defer(key, step, ONCE_STEP, payload)

        try:
            with once_scope(JournalOnce(self._journal, keep)):
                output = self._execute(tool, block, self._context(block))
        except (PermanentError, TemporaryError) as exc:
            return self._record(block, error=dispatch.failure(self.settings, name, exc))
        return self._record(block, output=output)

    def _execute(self, tool: Tool, block: Block, context: ToolContext) -> ToolOutput:
        refused = dispatch.unrunnable(tool)
        if refused is not None:
            raise refused
        if tool.has_side_effects:
            return self._perform(tool, block, context)
        stub = self._stubs.get(tool.name)
        run: Callable[[], ToolOutput] = (
            (lambda: tool.run(block["input"], context))
            if stub is None
            else (lambda: stubbed(stub, block["input"], context))
        )
        return call_with_retries(run, TOOL_RETRY, sleep=lambda _: None)

    def _perform(self, tool: Tool, block: Block, context: ToolContext) -> ToolOutput:
        action = self._action_for(tool, block, context)
        if block["id"] not in action.calls:
            action.calls.append(block["id"])
        if action.state is ActionState.PENDING_APPROVAL:
            raise ParkRun(RunStatus.WAITING, approval_wait(action.key))
        if action.state is ActionState.REJECTED:
            return dispatch.rejected_result(action.decided_by, action.note)
        if action.state is ActionState.CONFIRMED:
            return action.result or {}
        if action.state is ActionState.FAILED:
            raise PermanentError(f"{action.note} (a failure recorded, replayed)")
        if action.state is not ActionState.INTENDED:
            raise ParkRun(RunStatus.NEEDS_ATTENTION, person_wait(action.key))
        return self._send(tool, action, replace(context, idempotency_key=action.key))

    def _send(self, tool: Tool, action: Action, context: ToolContext) -> ToolOutput:
        stub = self._stubs.get(tool.name)
        if stub is None:  # recorded, nothing sent: the action stays as the key was saved
            return {"sent": False, "idempotency_key": action.key, "note": NOT_SENT}
        action.sends += 1
        try:
            with once_scope(None):  # as in a send: once() is refused
                result = stubbed(stub, action.args, context)
        except Exception as exc:
            error = classify(exc)
            if isinstance(error, PermanentError):
                action.state, action.note = ActionState.FAILED, str(error)
                raise error from exc
            action.state = ActionState.OUTCOME_UNKNOWN
            raise ParkRun(RunStatus.NEEDS_ATTENTION, person_wait(action.key)) from exc
        action.state = ActionState.CONFIRMED
        action.result = result if isinstance(result, dict) else {"text": str(result)}
        return result

    def _action_for(self, tool: Tool, block: Block, context: ToolContext) -> Action:
        """actions._action_for and rows.record_txn: the call's action, found by the call or
        recorded (or found) under its key, refused by its check or its cap."""
        key = dispatch.action_key(tool, block["input"], context)
        again = dispatch.action_key(tool, block["input"], self._context(block))
        recorded = self._action_of_call.get(block["id"])
        if key != again or (recorded is not None and recorded.key != key):
            first = recorded.key if recorded is not None else key
            second = again if key == first else key
            raise KeyNotStable(
                f"{tool.name}'s idempotency key changed between two computations of one call "
                f"({first!r}, then {second!r}): the key must follow "
                "from what the action means (its arguments, the run's input), or a retried run "
                "sends it again"
            )
        if recorded is not None:
            return recorded
        action = self._actions.get(key)
        if action is None:
            action = self._record_action(tool, block, key, context)
        elif not dispatch.carries_on(tool, action.tool, action.requires_approval):
            why = f"action {key!r} was recorded by {action.tool}; {tool.name} means the same key"
            raise ParkRun(RunStatus.NEEDS_ATTENTION, conflict_wait(key), reason=(KEY_CONFLICT, why))
        self._action_of_call[block["id"]] = action
        return action

    def _record_action(self, tool: Tool, block: Block, key: str, context: ToolContext) -> Action:
        assert tool.side_effect is not None
        if tool.side_effect.check is not None:
            call_with_retries(
                lambda: tool.check_action(block["input"], context), TOOL_RETRY, sleep=lambda _: None
            )
        new = dispatch.new_action(self.id, block, tool, key, self.settings)
        used = sum(
            a.service == new.service and a.state in dispatch.COUNTED for a in self._actions.values()
        )
        refused = dispatch.cap_refusal(new, used)
        if refused is not None:
            raise refused
        action = Action(
            new.key,
            new.tool,
            new.service,
            new.args,
            new.requires_approval,
            new.approvers,
            new.first_state,
        )
        self._actions[key] = action
        return action

    def _record(
        self, block: Block, *, output: ToolOutput | None = None, error: str | None = None
    ) -> None:
        """toolcalls._record: the result's journal entry; an artifact (a report, a large
        output) is kept in `artifacts`, by name, instead of PostgreSQL."""
        if error is None:
            try:
                content, artifact = dispatch.result_content(
                    self.id, block["name"], output, self.settings, self._next_artifact_id
                )
            except artifacts.ArtifactTooLarge as exc:
                error = f"{block['name']}: {exc}"
            else:
                if artifact is not None:
                    self.artifacts[artifact.ref["name"]] = artifact.data.decode()
        if error is not None:
            content = dispatch.scrub(self.settings, error)
        payload = dispatch.result_payload(block, content, is_error=error is not None)
        self._journal.defer(jr.tool_key(block["id"]), self.step, block["name"], payload)

    def _next_artifact_id(self) -> int:
        return len(self.artifacts) + 1
