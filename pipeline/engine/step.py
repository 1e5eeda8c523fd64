"""One durable step: claim -> limits -> model (journaled) -> tools (journaled) -> checkpoint.

Whatever a step makes runnable (its own next step, a batch's synthesis) is sent once the
transaction that made it so has committed.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import Any

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

import pipeline.instruments as instruments
import pipeline.statements as statements
import pipeline.tracing as tracing
from models import RunStatus
from pipeline.agent_definition import Agent, Conversation
from pipeline.app import send_step, send_step_after_commit
from pipeline.crash import crash_point
from pipeline.engine import dispatch, drift, quarantine, step_sql, stops
from pipeline.engine import journal as jr
from pipeline.engine.actions import ParkRun
from pipeline.engine.gate import Gate
from pipeline.engine.leases import Heartbeat, Lease, fenced, take
from pipeline.engine.limits import (
    Limits,
    alert_for,
    config_stop,
    limits_of,
    stop_for,
    warn_for,
)
from pipeline.engine.llm import Model, Reply, model_for
from pipeline.engine.outage import ModelCall
from pipeline.engine.state_replay import StepState
from pipeline.engine.step_sql import Claimed
from pipeline.engine.toolcalls import ToolCall, record_proposals, run_tool_call
from pipeline.engine.usage import Usage
from pipeline.engine.versions import RunVersions, StepVersion, version_for_step
from pipeline.errors import (
    DatabaseUnavailable,
    LeaseLost,
    NonDeterminism,
    PermanentError,
    RunStopped,
    StepTimeUp,
    TemporaryError,
    UnknownAgent,
)
from pipeline.keys import cut_key, model_key, note_key
from pipeline.logs import get_logger, step_context
from pipeline.registry import get_agent
from pipeline.runs import fanout, notifications
from pipeline.runs.failed_attempts import StepFailures
from pipeline.runs.obligations import settle_actions_of_ended_txn
from pipeline.runs.waits import is_settled_txn
from pipeline.settings import Settings, get_settings

log = get_logger("nightshift.engine")


class StepOutcome(StrEnum):
    """What one delivery of a step did (a run's outcome is pipeline.views.outcomes.RunOutcome)."""

    SKIPPED = "skipped"
    """Another worker holds the run, or it is not runnable: a normal duplicate delivery."""
    CONTINUE = "continue"
    """A step was checkpointed; its next step was sent."""
    STOPPED = "stopped"
    """The run reached a terminal or waiting status."""
    LEASE_LOST = "lease_lost"
    TIME_UP = "time_up"
    """The step passed its time limit: the run was handed to another attempt."""
    HANDED_ON = "handed_on"
    """A suspect step found this process's quarantine busy: it was sent again, uncounted."""
    UNKNOWN_AGENT = "unknown_agent"
    """This process has no agent of that name: the step was left for a worker that has it."""
    DATABASE_ERROR = "database_error"
    """A statement failed in PostgreSQL or a pooler: the run was handed to another attempt."""


@dataclass(frozen=True)
class StepResult:
    outcome: StepOutcome
    run_id: uuid.UUID
    detail: str = ""


@dataclass(frozen=True)
class RunSnapshot:
    """The run as this step found it after claiming."""

    id: uuid.UUID
    agent: str
    input: dict[str, Any]
    step: int
    max_steps: int
    state: dict[str, Any]
    batch_id: str | None
    """The batch this run is a child of."""
    belongs_to: str | None
    """The batch this run belongs to as the fan-out recorded it: its children's, or the one it
    is the synthesis of (what its tools see as ToolContext.batch_id)."""
    failures: StepFailures
    """The failed attempts of this step so far (a suspect runs in quarantine)."""
    versions: RunVersions


def execute_step(
    run_id: uuid.UUID,
    owner: str,
    settings: Settings | None = None,
    *,
    leave_unknown_agent: bool = False,
    ends_by: float | None = None,
) -> StepResult:
    """One step of the run, if this process can claim it.

    An agent this process does not know fails the run, unless `leave_unknown_agent`: then the
    lease is given up untouched and the caller hands the step to another worker. At the first
    model or tool call after `ends_by` (time.monotonic()) the step raises StepTimeUp
    (pipeline/engine/time_limit.py bounds steps with it).
    """
    settings = settings or get_settings()
    seen = jr.Journal.seen(run_id)
    try:  # the claim and everything the step loads: one round trip
        claimed = take(run_id, owner, settings.lease_seconds, settings, seen.last_id)
    except (DBAPIError, psycopg.Error) as exc:
        # Nothing was done (a claim that committed unseen is a live lease: a redelivery skips).
        orig = getattr(exc, "orig", None) or exc
        raise DatabaseUnavailable(f"run {run_id}: no claim, PostgreSQL failed: {orig!r}") from exc
    except PoolTimeout as exc:  # every kept connection stayed busy for a lease
        raise DatabaseUnavailable(f"run {run_id}: no claim, no free connection: {exc}") from exc
    if claimed is None:
        log.info("run %s: not claimable (live lease elsewhere or not running); skipping", run_id)
        instruments.STEPS.labels("", StepOutcome.SKIPPED.value).inc()
        return StepResult(StepOutcome.SKIPPED, run_id)
    lease = Lease(run_id, claimed.fence, owner)
    loaded = _loaded(run_id, claimed, seen)
    run = loaded.run
    started = time.perf_counter()
    with (
        tracing.step_span(claimed.run.trace_context, run_id, run.agent, run.step, owner,
                          claimed.fence, claimed.taken_from) as span,
        Heartbeat(lease, settings.lease_seconds, settings.heartbeat_seconds) as heartbeat,
    ):  # fmt: skip
        try:
            wait = quarantine.wait_for_turn(ends_by, settings.step_time_limit / 2)
            with quarantine.admitted(lease, run.step, run.failures, wait) as admitted:
                if admitted:
                    runner = StepRunner(lease, heartbeat, settings, loaded, ends_by)
                    result = runner.run(leave_unknown_agent=leave_unknown_agent)
                else:
                    quarantine.hand_on(lease, run.agent, run.step, run.batch_id)
                    result = StepResult(StepOutcome.HANDED_ON, run_id)
        except LeaseLost as exc:
            log.warning("run %s: %s; stopping without writing", run_id, exc)
            result = StepResult(StepOutcome.LEASE_LOST, run_id)
        tracing.annotate(span, "nightshift.step.outcome", result.outcome.value)
    agent = run.agent
    instruments.STEPS.labels(agent, result.outcome.value).inc()
    instruments.STEP_SECONDS.labels(agent).observe(time.perf_counter() - started)
    return result


@dataclass(frozen=True)
class Loaded:
    run: RunSnapshot
    journal: jr.Journal
    limits: Limits


def _loaded(run_id: uuid.UUID, claimed: Claimed, seen: jr.Seen) -> Loaded:
    row = claimed.run
    snapshot = RunSnapshot(
        id=run_id,
        agent=row.agent,
        input=row.input,
        step=row.step,
        max_steps=row.max_steps,
        state=row.state,
        batch_id=row.batch_id,
        belongs_to=row.batch_id or row.synthesis_of,
        failures=StepFailures.of(row.failed_step, row.failed_attempts, row.failures, row.step),
        versions=RunVersions(row.agent_version, row.running_version, row.allowed_version),
    )
    journal = jr.Journal.extended(run_id, seen, claimed.entries)
    return Loaded(snapshot, journal, limits_of(claimed.limits))


class StepRunner:
    def __init__(
        self,
        lease: Lease,
        heartbeat: Heartbeat,
        settings: Settings,
        loaded: Loaded,
        ends_by: float | None = None,
    ) -> None:
        self.lease = lease
        self.ends_by = ends_by
        """The step's time bound (time.monotonic()); None: unbounded (a caller in-process)."""
        self.heartbeat = heartbeat
        self.settings = settings
        self.loaded = loaded
        self._limits: Limits | None = loaded.limits
        """Limits read in the transaction that just committed: the next check uses them."""
        self.model: Model = model_for(settings)
        self.agent: Agent | None = None
        self.gate: Gate | None = None
        """Flow control (pipeline/engine/gate.py), once the agent is known."""
        self.calls_in_step = 0
        self.usage = Usage()
        """What this step's model calls used (journaled replies, replayed ones included): added
        to the run's counters by the checkpoint or the finish."""
        run = loaded.run
        self.state = StepState(
            run.state, loaded.journal.entries, run.step, settings.agent_state_max_bytes
        )
        """The agent state as this step's tool calls leave it: written by the checkpoint."""

    def run(self, *, leave_unknown_agent: bool = False) -> StepResult:
        run, journal = self.loaded.run, self.loaded.journal
        with step_context(run.id, run.agent, run.step, self.lease.owner):
            try:
                agent = self.agent = get_agent(run.agent)
            except UnknownAgent as exc:
                return self._unknown_agent(run, exc, leave=leave_unknown_agent)
            self.gate = Gate(self.lease, agent, self.model.name, self.settings)
            try:
                return self._run(run, agent, journal)
            finally:
                self.gate.leave()  # after the park or the checkpoint committed

    def _run(self, run: RunSnapshot, agent: Agent, journal: jr.Journal) -> StepResult:
        failures = run.failures
        if failures.count >= agent.max_step_attempts:
            return self._finish(run, RunStatus.FAILED, failures.kind.value,
                                error=f"stopped: {failures.describe()}")  # fmt: skip
        if run.step >= run.max_steps:
            return self._finish(run, RunStatus.FAILED, "max_steps", error="stopped: max_steps")
        # One line a step for an operator, at its end (checkpointed, parked, finished); its
        # start is Celery's "received" line.
        log.debug("working (fence %d)", self.lease.fence)
        try:
            version = version_for_step(self.lease, agent, run.versions, bool(journal.entries))
            return self._step(run, agent, journal, version)
        except ParkRun as park:
            return self._park(run, park)
        except RunStopped as stopped:
            status = RunStatus.CANCELLED if stopped.reason == "cancelled" else RunStatus.FAILED
            return self._finish(run, status, stopped.reason, error=str(stopped))
        except NonDeterminism as exc:
            return self._finish(run, RunStatus.FAILED, drift.NON_DETERMINISM, error=str(exc))
        except PermanentError as exc:
            return self._finish(
                run, RunStatus.FAILED, "model_error", error=f"model call failed: {exc}"
            )
        except TemporaryError as exc:
            return self._finish(
                run,
                RunStatus.FAILED,
                "model_unavailable",
                error=f"model unavailable: {exc}",
            )

    def _unknown_agent(self, run: RunSnapshot, exc: UnknownAgent, *, leave: bool) -> StepResult:
        if not leave:
            error = f"unknown agent on this worker ({self.lease.owner}): {exc}"
            return self._finish(run, RunStatus.FAILED, "unknown_agent", error=error)
        with fenced(self.lease) as session:
            statements.execute(session, "release_lease", run_id=run.id, fence=self.lease.fence)
        log.warning(
            "agent %r is not registered here; leaving the step to another worker", run.agent
        )
        return StepResult(StepOutcome.UNKNOWN_AGENT, run.id, detail=str(exc))

    def _keep_going(self, before_tool: bool = False) -> None:
        """Before every model and tool call: stop if the lease is gone, the run was cancelled,
        passed its deadline or a budget. Raises BaseException subclasses, past any
        `except Exception` in an agent or a tool."""
        self.heartbeat.check()
        if self.ends_by is not None and time.monotonic() >= self.ends_by:
            raise StepTimeUp(f"run {self.lease.run_id}: the step reached its time limit")
        limits, self._limits = self._limits, None
        if limits is None:
            limits = limits_of(step_sql.read_limits(self.lease.run_id, self.settings))
        warn_for(limits, self.lease, self.settings)
        stop = stop_for(limits, self.agent, self.settings, self.calls_in_step, before_tool)
        if stop is None:
            return
        alert_for(stop, limits.spend, self.lease, self.settings)
        raise stop

    def _step(
        self, run: RunSnapshot, agent: Agent, journal: jr.Journal, version: StepVersion
    ) -> StepResult:
        unconfigured = config_stop(agent, self.settings)
        if unconfigured is not None:
            raise unconfigured  # before any model call or send: the run fails with `config`
        messages = journal.messages(agent, run.input, before_step=run.step)
        replayed = journal.replay(model_key(run.step), jr.MODEL_STEP) is not None
        reply = self._model_reply(run, agent, journal, messages)
        stop = stops.stop_for_reply(reply)
        if stop is not None:
            raise stop
        uses = dispatch.tool_uses(reply)
        calls = [
            ToolCall(
                self.lease,
                run.id,
                run.agent,
                run.step,
                run.input,
                b,
                last=b is uses[-1],
                replayed=replayed,
                version=version,
                batch_id=run.belongs_to,
            )
            for b in uses
        ]
        record_proposals(calls, agent, journal, self.settings, self.state)
        for call in calls:
            self._keep_going(before_tool=True)
            self.calls_in_step += 1
            run_tool_call(call, agent, journal, self.settings, self._keep_going, self.state)
        if dispatch.continues(reply):
            # Paused: the next step sends this content back as-is and the model continues it.
            return self._checkpoint(run, tool_calls=len(uses))
        messages = journal.messages(agent, run.input, before_step=run.step + 1, remember=False)
        state = self.state.run_state()
        conversation = Conversation(input=run.input, messages=messages, state=state)
        if agent.check_success is not None and not agent.check_success(conversation):
            with fenced(self.lease) as session:
                note = {"text": dispatch.SUCCESS_CHECK_NOTE}
                journal.append_txn(session, note_key(run.step), run.step, jr.NOTE_STEP, note)
            log.info("success check failed; continuing")
            return self._checkpoint(run, tool_calls=0)
        result = dispatch.answer(conversation, reply)
        return self._finish(run, RunStatus.SUCCEEDED, "completed", result=result, reply=reply)

    def _model_reply(
        self, run: RunSnapshot, agent: Agent, journal: jr.Journal, messages: list[dict[str, Any]]
    ) -> Reply:
        """The step's reply, journaled before it is acted on. A reply cut off at max_tokens is
        journaled apart (for its cost) and asked again with more room, so a replay meets the
        same cut-offs, asks with the same room and acts on the same complete reply."""
        prices = self.settings.prices
        key = model_key(run.step)
        journaled = journal.replay(key, jr.MODEL_STEP)
        cut_offs = journal.cut_offs(run.step)
        for cut in cut_offs:
            self.usage += Usage.of(cut, prices)
        if journaled is not None:
            if self.gate is not None:  # its tools run again: in a turn
                self.gate.admit(None)
            log.info("model reply replayed from the journal")
            instruments.MODEL_CALLS.labels(run.agent, "replayed").inc()
            self.usage += Usage.of(journaled, prices)
            return journaled
        while True:
            attempt = len(cut_offs)
            room = stops.room_for(agent.max_tokens, self.settings.max_tokens_cap, attempt)
            if room is None:
                raise stops.cut_off_stop(run.step, cut_offs[-1]["max_tokens"])
            self._keep_going()
            reply = self._timed_model_call(run, agent, messages, room)
            self.usage += Usage.of(reply, prices)
            if not stops.is_cut_off(reply):
                break
            cut = {**reply, "max_tokens": room}
            with fenced(self.lease) as session:
                journal.append_txn(session, cut_key(run.step, attempt), run.step, jr.CUT_STEP, cut)
            cut_offs.append(cut)
            crash_point("after_cut_off_journaled")
            log.warning("the reply was cut off at max_tokens=%d; asking again", room)
        # Journaled before it is acted on, with the limits for the check before the first tool.
        lease = self.lease
        limits = step_sql.journal_reply(
            run.id, lease.fence, key, run.step, jr.MODEL_STEP, reply, self.settings
        )
        if limits is None:
            raise LeaseLost(f"run {run.id}: fence {lease.fence} is no longer current")
        journal.remember(key, run.step, jr.MODEL_STEP, reply)
        self._limits = limits_of(limits)
        crash_point("after_model_journaled")
        return reply

    def _timed_model_call(
        self, run: RunSnapshot, agent: Agent, messages: list[dict[str, Any]], room: int
    ) -> Reply:
        if self.gate is not None:  # its turn, or the run parks until it comes
            self.gate.admit(messages, room)
        started, result = time.perf_counter(), "error"
        try:
            # Brief retries here; past them the run parks until the provider answers again.
            call = ModelCall(self.lease, self.model.name, self.settings, self.heartbeat.check)
            with tracing.model_call(self.model.name, run.agent) as span:
                reply = call.reply(partial(self.model.reply, agent, messages, max_tokens=room))
                tracing.model_replied(span, reply)
            result = "ok"
        finally:
            instruments.MODEL_CALLS.labels(run.agent, result).inc()
            instruments.MODEL_SECONDS.labels(run.agent).observe(time.perf_counter() - started)
        if self.gate is not None:
            self.gate.settle(reply)
        usage = reply.get("usage") or {}
        for kind in ("input", "output"):
            instruments.MODEL_TOKENS.labels(run.agent, kind).inc(usage.get(f"{kind}_tokens") or 0)
        return reply

    def _checkpoint(self, run: RunSnapshot, tool_calls: int) -> StepResult:
        """Commit the step, give up the lease and send the next step once that committed."""
        crash_point("before_checkpoint")
        lease = self.lease
        deferred = self.loaded.journal.take_deferred()  # the last tool result
        usage = self.usage.amounts()
        state = self.state.to_checkpoint()
        handed_off = step_sql.checkpoint(run.id, lease.fence, tool_calls, usage, deferred, state)
        if handed_off is None:
            raise LeaseLost(f"run {run.id}: fence {lease.fence} is no longer current")
        crash_point("after_checkpoint_before_enqueue")
        send_step(run.id, agent=run.agent, step=run.step + 1, batch=run.batch_id,
                  handed_off=handed_off)  # fmt: skip
        log.info("checkpointed (fence %d)", lease.fence)
        return StepResult(StepOutcome.CONTINUE, run.id)

    def _send_next(self, session: Session, run: RunSnapshot, step: int) -> None:
        send_step_after_commit(session, run.id, agent=run.agent, step=step, batch=run.batch_id)

    def _park(self, run: RunSnapshot, park: ParkRun) -> StepResult:
        """Leave the run waiting with no lease and no message; this step is replayed later."""
        crash_point("before_park")
        fence = self.lease.fence
        with fenced(self.lease) as session:
            # After the fence guard locked the run row: a decision that commits later has its
            # wake wait for that lock and then find the run parked, so one of the two moves it.
            if is_settled_txn(session, park.waiting_on):
                # Decided after this step recorded the action and before this park; its wake
                # found the run still running. Replay the step instead of waiting.
                statements.execute(session, "release_to_replay", run_id=run.id, fence=fence)
                self._send_next(session, run, run.step)
                log.info("%s was decided before the run parked; replaying", park.waiting_on)
                return StepResult(StepOutcome.CONTINUE, run.id)
            code, why = park.reason or (None, None)
            row = statements.first(
                session, "park", run_id=run.id, fence=fence, status=park.status, reason=code,
                error=why, waiting_on=park.waiting_on, wake_at=park.wake_at,
            )  # fmt: skip
            parked = RunStatus(row.status) if row is not None else None
            if parked is RunStatus.CANCELLED:
                settle_actions_of_ended_txn(session, [run.id], "cancelled")
            notifications.dispatch_new_txn(session)  # a wait for a person may be worth telling
        log.info("parked: %s on %s", parked or park.status, park.waiting_on)
        return StepResult(StepOutcome.STOPPED, run.id)

    def _finish(
        self,
        run: RunSnapshot,
        status: RunStatus,
        reason: str,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        reply: Reply | None = None,
    ) -> StepResult:
        steps_done = 1 if reply is not None else 0
        with fenced(self.lease) as session:
            changed = statements.execute(
                session, "finish", run_id=run.id, fence=self.lease.fence,
                sources=list(RunStatus.sources_of(status)), status=status, reason=reason,
                result=statements.jsonb(result), error=error, steps_done=steps_done,
                terminal=status.is_terminal(), **self.usage.amounts(),
            )  # fmt: skip
            if changed and status.is_terminal():
                settle_actions_of_ended_txn(session, [run.id], reason)
                # The batch's own end in the finish's transaction; its join once it committed.
                fanout.synthesis_finished_txn(session, run.id, status)
                if run.batch_id:
                    fanout.join_after_commit(session, run.batch_id)
                notifications.dispatch_new_txn(session)  # its notify_url's, and its batch's
        tracing.mark({"nightshift.run.status": status.value, "nightshift.run.reason": reason})
        log.info("run %s (%s)%s", status, reason, f": {error}" if error else "")
        if changed and status.is_terminal():
            instruments.RUNS_FINISHED.labels(run.agent, status.value, reason).inc()
        if not changed:
            log.warning("the status changed under this step; %s not recorded", status)
        return StepResult(StepOutcome.STOPPED, run.id)
