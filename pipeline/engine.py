"""One durable step: claim -> limits -> model (journaled) -> tools (journaled) -> checkpoint.

The step returns what should happen next; the task sends the next message after the commit.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import DateTime, case, cast, func, literal, select, update
from sqlalchemy.orm import Session

from models import Action, ActionState, BatchStatus, Run, RunStatus
from pipeline import budgets, fanout
from pipeline import journal as jr
from pipeline.actions import ParkRun
from pipeline.agents import get_agent
from pipeline.agents.base import Agent, Conversation
from pipeline.crash import crash_point
from pipeline.db import transaction
from pipeline.errors import (
    LeaseLost,
    NightshiftError,
    NonDeterminism,
    PermanentError,
    RunStopped,
    TemporaryError,
)
from pipeline.leases import Heartbeat, Lease, claim_from_dead_txn, claim_txn, fenced
from pipeline.llm import Model, Reply, model_for
from pipeline.logs import get_logger, step_context
from pipeline.retry import RetryPolicy, call_with_retries
from pipeline.settings import Settings, get_settings
from pipeline.toolcalls import ToolCall, record_proposals, run_tool_call

log = get_logger("nightshift.engine")

MODEL_RETRY = RetryPolicy(attempts=6, base_seconds=0.5, cap_seconds=15.0)
SUCCESS_CHECK_NOTE = (
    "The success check failed: the task is not finished yet. Keep going and complete it."
)


class Outcome(StrEnum):
    SKIPPED = "skipped"
    """Another worker holds the run, or it is not runnable: a normal duplicate delivery."""
    CONTINUE = "continue"
    """A step was checkpointed; send the next one."""
    STOPPED = "stopped"
    """The run reached a terminal or waiting status."""
    LEASE_LOST = "lease_lost"


@dataclass(frozen=True)
class StepResult:
    outcome: Outcome
    run_id: uuid.UUID
    agent: str | None = None
    step: int | None = None
    batch: str | None = None
    enqueue: tuple[uuid.UUID, ...] = ()
    """Other runs this step made runnable (a batch's synthesis): send them after the commit."""


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


def execute_step(run_id: uuid.UUID, owner: str, settings: Settings | None = None) -> StepResult:
    settings = settings or get_settings()
    with transaction() as session:  # claim and load in one round of the database
        lease = claim_txn(session, run_id, owner, settings.lease_seconds) or claim_from_dead_txn(
            session, run_id, owner, settings.lease_seconds
        )
        loaded = _load_txn(session, run_id) if lease is not None else None
    if lease is None or loaded is None:
        log.info("run %s: not claimable (live lease elsewhere or not running); skipping", run_id)
        return StepResult(Outcome.SKIPPED, run_id)
    with Heartbeat(lease, settings.lease_seconds, settings.heartbeat_seconds) as heartbeat:
        try:
            return StepRunner(lease, heartbeat, settings, loaded).run()
        except LeaseLost as exc:
            log.warning("run %s: %s; stopping without writing", run_id, exc)
            return StepResult(Outcome.LEASE_LOST, run_id)


@dataclass(frozen=True)
class Loaded:
    run: RunSnapshot
    journal: jr.Journal
    limits: Limits


@dataclass(frozen=True)
class Limits:
    """What the stop checks read, as of one transaction."""

    cancel_requested: bool
    cancelled_by: str | None
    past_deadline: bool
    spend: budgets.Spend


def _limits_txn(session: Session, run_id: uuid.UUID) -> Limits:
    row = session.execute(
        select(Run.cancel_requested, Run.cancel_requested_by, Run.deadline <= func.now()).where(
            Run.id == run_id
        )
    ).one()
    return Limits(row[0], row[1], bool(row[2]), budgets.spend_txn(session, run_id))


def _load_txn(session: Session, run_id: uuid.UUID) -> Loaded:
    row = session.execute(
        select(
            Run.id, Run.agent, Run.input, Run.step, Run.max_steps, Run.state, Run.batch_id
        ).where(Run.id == run_id)
    ).one()
    snapshot = RunSnapshot(
        id=row.id,
        agent=row.agent,
        input=row.input,
        step=row.step,
        max_steps=row.max_steps,
        state=row.state,
        batch_id=row.batch_id,
    )
    return Loaded(snapshot, jr.Journal.load_txn(session, run_id), _limits_txn(session, run_id))


class StepRunner:
    def __init__(
        self, lease: Lease, heartbeat: Heartbeat, settings: Settings, loaded: Loaded
    ) -> None:
        self.lease = lease
        self.heartbeat = heartbeat
        self.settings = settings
        self.loaded = loaded
        self._limits: Limits | None = loaded.limits
        """Limits read in the transaction that just committed: the next check uses them."""
        self.model: Model = model_for(settings)
        self.agent: Agent | None = None
        self.calls_in_step = 0

    def run(self) -> StepResult:
        run, journal = self.loaded.run, self.loaded.journal
        with step_context(run.id, run.agent, run.step, self.lease.owner):
            return self._run(run, journal)

    def _run(self, run: RunSnapshot, journal: jr.Journal) -> StepResult:
        try:
            agent = self.agent = get_agent(run.agent)
        except NightshiftError as exc:
            return self._finish(run, RunStatus.FAILED, "unknown_agent", error=str(exc))
        stop = self._limit_reached(run)
        if stop is not None:
            status, reason = stop
            return self._finish(run, status, reason, error=f"stopped: {reason}")
        log.info("working (fence %d)", self.lease.fence)
        try:
            return self._step(run, agent, journal)
        except ParkRun as park:
            return self._park(run, park)
        except RunStopped as stopped:
            status = RunStatus.CANCELLED if stopped.reason == "cancelled" else RunStatus.FAILED
            return self._finish(run, status, stopped.reason, error=str(stopped))
        except NonDeterminism as exc:
            return self._finish(run, RunStatus.FAILED, "non_determinism", error=str(exc))
        except PermanentError as exc:
            return self._finish(
                run, RunStatus.FAILED, "model_error", error=f"model call failed: {exc}"
            )
        except TemporaryError as exc:
            return self._finish(
                run,
                RunStatus.FAILED,
                "model_unavailable",
                error=f"model unavailable after {MODEL_RETRY.attempts} attempts: {exc}",
            )

    def _keep_going(self, before_tool: bool = False) -> None:
        """Before every model and tool call: stop if the lease is gone, the run was cancelled,
        passed its deadline or a budget. Raises BaseException subclasses, past any
        `except Exception` in an agent or a tool."""
        self.heartbeat.check()
        limits, self._limits = self._limits, None
        if limits is None:
            with transaction() as session:
                limits = _limits_txn(session, self.lease.run_id)
        stop = _stop_for(limits, self.agent, self.settings, self.calls_in_step, before_tool)
        if stop is None:
            return
        alert = None
        spend = limits.spend
        with transaction() as session:
            if stop.reason == "budget" and spend.batch_status is BatchStatus.RUNNING:
                assert spend.batch_id is not None
                alert = budgets.stop_batch_txn(session, spend.batch_id, "budget", str(stop))
            elif stop.reason.startswith("max_"):
                subject = f"run:{self.lease.run_id}"
                kind = f"budget_{stop.reason}"
                alert = budgets.raise_alert_txn(session, kind, subject, str(stop))
        if alert is not None:
            budgets.notify(alert, self.settings)
        raise stop

    def _limit_reached(self, run: RunSnapshot) -> tuple[RunStatus, str] | None:
        """Limits known from the snapshot; cancel and deadline are checked before each call."""
        if run.step >= run.max_steps:
            return RunStatus.FAILED, "max_steps"
        return None

    def _step(self, run: RunSnapshot, agent: Agent, journal: jr.Journal) -> StepResult:
        messages = journal.messages(agent, run.input, before_step=run.step)
        reply = self._model_reply(run, agent, journal, messages)
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        calls = [ToolCall(self.lease, run.id, run.agent, run.step, run.input, b) for b in uses]
        record_proposals(calls, agent, journal, self.settings)
        for call in calls:
            self._keep_going(before_tool=True)
            self.calls_in_step += 1
            run_tool_call(call, agent, journal, self.settings, self._keep_going)
        if uses:
            return self._checkpoint(run, reply, tool_calls=len(uses))
        messages = journal.messages(agent, run.input, before_step=run.step + 1, remember=False)
        conversation = Conversation(input=run.input, messages=messages, state=run.state)
        if agent.check_success is not None and not agent.check_success(conversation):
            with fenced(self.lease) as session:
                journal.append_txn(
                    session,
                    jr.note_key(run.step),
                    run.step,
                    jr.NOTE_STEP,
                    {"text": SUCCESS_CHECK_NOTE},
                )
            log.info("success check failed; continuing")
            return self._checkpoint(run, reply, tool_calls=0)
        result = {"text": conversation.last_text(), "state": run.state}
        return self._finish(run, RunStatus.SUCCEEDED, "completed", result=result, reply=reply)

    def _model_reply(
        self, run: RunSnapshot, agent: Agent, journal: jr.Journal, messages: list[dict[str, Any]]
    ) -> Reply:
        key = jr.model_key(run.step)
        journaled = journal.replay(key, jr.MODEL_STEP)
        if journaled is not None:
            log.info("model reply replayed from the journal")
            return journaled
        self._keep_going()
        reply = call_with_retries(
            lambda: self.model.reply(agent, messages),
            MODEL_RETRY,
            before_retry=self.heartbeat.check,
        )
        with fenced(self.lease) as session:
            journal.append_txn(session, key, run.step, jr.MODEL_STEP, reply)
            self._limits = _limits_txn(session, run.id)  # for the check before the first tool
        crash_point("after_model_journaled")
        return reply

    def _checkpoint(self, run: RunSnapshot, reply: Reply, tool_calls: int) -> StepResult:
        """Commit the step and release the lease so the next step's message can claim at once."""
        crash_point("before_checkpoint")
        usage = reply.get("usage") or {}
        with fenced(self.lease) as session:
            session.execute(
                update(Run)
                .where(Run.id == run.id)
                .values(
                    step=Run.step + 1,
                    tool_calls=Run.tool_calls + tool_calls,
                    input_tokens=Run.input_tokens + int(usage.get("input_tokens", 0)),
                    output_tokens=Run.output_tokens + int(usage.get("output_tokens", 0)),
                    lease_owner=None,
                    lease_expires_at=None,
                )
            )
        log.info("checkpointed")
        return StepResult(Outcome.CONTINUE, run.id, run.agent, run.step + 1, run.batch_id)

    def _park(self, run: RunSnapshot, park: ParkRun) -> StepResult:
        """Leave the run waiting with no lease and no message; this step is replayed later."""
        with fenced(self.lease) as session:
            if _approved_meanwhile_txn(session, park.waiting_on):
                # The decision landed after this step recorded the action and before this park;
                # its wake found the run still running. Replay the step instead of waiting.
                session.execute(
                    update(Run)
                    .where(Run.id == run.id)
                    .values(lease_owner=None, lease_expires_at=None)
                )
                log.info("%s was decided before the run parked; replaying", park.waiting_on)
                return StepResult(Outcome.CONTINUE, run.id, run.agent, run.step, run.batch_id)
            session.execute(
                update(Run)
                .where(Run.id == run.id, Run.status == RunStatus.RUNNING)
                .values(
                    # A cancel that arrived during this step wins over waiting.
                    status=case(
                        (Run.cancel_requested, RunStatus.CANCELLED.value), else_=park.status.value
                    ),
                    stop_reason=case((Run.cancel_requested, "cancelled"), else_=None),
                    finished_at=case((Run.cancel_requested, func.now()), else_=None),
                    waiting_on=park.waiting_on,
                    wake_at=case(
                        (Run.cancel_requested, None),
                        else_=cast(literal(park.wake_at), DateTime(timezone=True)),
                    ),
                    lease_owner=None,
                    lease_expires_at=None,
                )
            )
        log.info("parked: %s on %s", park.status, park.waiting_on)
        return StepResult(Outcome.STOPPED, run.id, run.agent, run.step, run.batch_id)

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
        usage = (reply or {}).get("usage") or {}
        steps_done = 1 if reply is not None else 0
        with fenced(self.lease) as session:
            changed = session.execute(
                update(Run)
                .where(Run.id == run.id, Run.status.in_(RunStatus.sources_of(status)))
                .values(
                    status=status,
                    stop_reason=reason,
                    result=result,
                    error=error,
                    step=Run.step + steps_done,
                    input_tokens=Run.input_tokens + int(usage.get("input_tokens", 0)),
                    output_tokens=Run.output_tokens + int(usage.get("output_tokens", 0)),
                    lease_owner=None,
                    lease_expires_at=None,
                    finished_at=func.now() if status.is_terminal() else None,
                )
            ).rowcount  # type: ignore[attr-defined]
            ready = self._join_txn(session, run, status) if changed else []
        log.info("run %s (%s)%s", status, reason, f": {error}" if error else "")
        if not changed:
            log.warning("the status changed under this step; %s not recorded", status)
        return StepResult(
            Outcome.STOPPED, run.id, run.agent, run.step, run.batch_id, enqueue=tuple(ready)
        )

    @staticmethod
    def _join_txn(session: Session, run: RunSnapshot, status: RunStatus) -> list[uuid.UUID]:
        """In the same transaction as the finish: the batch join, and the batch's own end."""
        if not status.is_terminal():
            return []
        fanout.synthesis_finished_txn(session, run.id, status)
        return fanout.child_finished_txn(session, run.batch_id) if run.batch_id else []


def _approved_meanwhile_txn(session: Session, waiting_on: str) -> bool:
    """Whether the approval this park would wait for has been decided already.

    Runs after the fence guard locked the run row: a decision that commits later has its wake
    UPDATE wait for that lock and then find the run parked, so one of the two moves it on.
    """
    kind, _, key = waiting_on.partition(":")
    if kind != "approval":
        return False
    state = session.scalar(select(Action.state).where(Action.idempotency_key == key))
    return state not in (None, ActionState.PENDING_APPROVAL)


def _stop_for(
    limits: Limits,
    agent: Agent | None,
    settings: Settings,
    calls_in_step: int,
    before_tool: bool,
) -> RunStopped | None:
    """The first reason this run must stop before its next call, if any."""
    spend = limits.spend
    if limits.cancel_requested:
        return RunStopped("cancelled", f"cancelled by {limits.cancelled_by}")
    if limits.past_deadline:
        return RunStopped("deadline", "the run's deadline passed")
    if spend.batch_status is BatchStatus.STOPPED:
        reason = spend.batch_stop_reason or "budget"
        return RunStopped(reason, f"batch {spend.batch_id} was stopped ({reason})")
    over = budgets.batch_over_budget(spend, settings)
    if over is not None:
        return RunStopped("budget", over)
    if agent is None:
        return None
    calls = spend.tool_calls + calls_in_step
    if before_tool and agent.max_tool_calls is not None and calls >= agent.max_tool_calls:
        return RunStopped(
            "max_tool_calls", f"{calls} tool calls; the limit is {agent.max_tool_calls}"
        )
    if agent.max_run_tokens is not None and spend.tokens >= agent.max_run_tokens:
        return RunStopped(
            "max_tokens", f"{spend.tokens} tokens; the limit is {agent.max_run_tokens}"
        )
    return None
