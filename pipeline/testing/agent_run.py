"""A run of an agent in a test: started, stepped, decided and timed by the runtime's own code
(runs.start, the real step, runs.decisions, the tick) on the run's own database, with the
test's settings, its agent and the in-process hand-off in force while it moves."""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

import pipeline.statements as statements
from models import Action as ActionRow
from models import (
    ActionKind,
    ActionState,
    Artifact,
    Batch,
    BatchStatus,
    JournalEntry,
    Run,
    RunStatus,
)
from pipeline.agent_definition import Agent, Message
from pipeline.app import step_queue
from pipeline.db import read_only, transaction
from pipeline.engine import dispatch
from pipeline.engine import journal as jr
from pipeline.registry import agents_by_value, registry
from pipeline.runs.deadlines import Deadline, parse_deadline
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.fanout import start_synthesis_txn
from pipeline.runs.start import start_run
from pipeline.runs.tick import tick
from pipeline.settings import Settings, config_variable, get_settings
from pipeline.testing.clock import move_forward
from pipeline.testing.database import RunDatabase, data_dir, give_back, take
from pipeline.testing.handoff import InProcessQueue
from pipeline.testing.records import Action, Call, CannedReply, Stub
from pipeline.testing.stand_ins import Recorder, stand_in_agent
from pipeline.tools import AgentState, ToolContext

DECIDED_VIA = "pipeline.testing"
"""How a test's decisions are recorded in the action's audit trail."""


def run_agent(
    agent: Agent,
    run_input: dict[str, Any],
    *,
    tools: Mapping[str, Stub] | None = None,
    replies: Iterable[CannedReply] | None = None,
    config: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    deadline: float | str | None = None,
    batch: str | None = None,
) -> AgentRun:
    """Start a run of `agent` on `run_input` and run it until it ends or waits.

    `tools`: stubs by tool name. `replies`: the model's replies in order, instead of the
    agent's script. `config`: tools' own settings (`{"oncall.web_url": ...}`, what
    `context.config` reads). `env`: nightshift's settings by variable, as a worker would have
    them (`{"NIGHTSHIFT_APPROVERS_MAIL_DIGEST": "alice"}`); the process environment is not
    read. `deadline`: as `start_run` takes it (seconds, `"15m"`, an ISO-8601 time). `batch`:
    run it as that batch's synthesis, as a night's fan-out starts one once its children are done
    (its tools see `context.batch_id == batch`; without it, a run started on its own has none)."""
    variables = {config_variable(k): v for k, v in (config or {}).items()}
    return AgentRun(agent, run_input, dict(tools or {}), replies, {**(env or {}), **variables},
                    deadline, batch)  # fmt: skip


def tool_context(
    agent: Agent,
    run_input: dict[str, Any],
    *,
    config: Mapping[str, str] | None = None,
    tool_use_id: str = "toolu_test",
    batch_id: str | None = None,
    state: Mapping[str, Any] | None = None,
) -> ToolContext:
    """The context a tool of `agent` gets in a run with this input, to call one tool directly:
    `mail_digest.action_key(args, tool_context(AGENT, RUN))`, `read_handover.run(...)`.
    `batch_id`: the batch the run belongs to (a child's, or the one it is the synthesis of).
    `state`: the agent state the call finds (`context.state`; read what it left with
    `context.state.document()`)."""
    block = {"id": tool_use_id, "name": "", "input": {}}
    settings = Settings.from_env({config_variable(k): v for k, v in (config or {}).items()})
    seen = AgentState(state, settings.agent_state_max_bytes)
    return dispatch.context_for(
        uuid.uuid4(), agent.name, block, settings, run_input, batch_id=batch_id, state=seen
    )


def start_synthesis(
    agent_name: str, run_input: dict[str, Any], batch: str, deadline: Deadline | None = None
) -> uuid.UUID:
    """Start a run of `agent_name` as batch `batch`'s synthesis, the way a night's fan-out
    starts one (runs.fanout.start_synthesis_txn), for a batch of that id recorded here with no
    children of its own: what a synthesis agent's test needs to run it as a night does."""
    if isinstance(deadline, timedelta):
        deadline = datetime.now(UTC) + deadline
    with transaction() as session:
        statements.execute(
            session, "create_batch", batch_id=batch, name=agent_name,
            params=statements.jsonb({"synthesis_agent": agent_name}), token_cap=None,
            cost_cap_usd=None, tool_call_cap=None, deadline=deadline, notify_url=None,
        )  # fmt: skip
        row = session.get(Batch, batch)
        assert row is not None
        return start_synthesis_txn(session, row, run_input, BatchStatus.SYNTHESIZING).run_id


class AgentRun:
    """A run of an agent in a test (see the package's docstring). What it shows is read from
    its database when asked; `approve`, `reject`, `resolve` and `advance` move it on."""

    def __init__(
        self,
        agent: Agent,
        run_input: dict[str, Any],
        stubs: dict[str, Stub],
        replies: Iterable[CannedReply] | None,
        variables: dict[str, str],
        deadline: float | str | None,
        batch: str | None = None,
    ) -> None:
        self._recorder = Recorder()
        self.agent = stand_in_agent(agent, stubs, replies, self._recorder)
        """The agent as this run runs it: its stubbed tools and side effects standing in."""
        self.input = run_input
        self._moved = timedelta(0)
        self._queue = InProcessQueue()
        self._registry = agents_by_value([self.agent], DECIDED_VIA)
        parsed_deadline = parse_deadline(deadline)
        self._database: RunDatabase = take()
        weakref.finalize(self, give_back, self._database)
        # A data directory of pipeline.testing's own unless the test names one (tools keep
        # files there: a git worktree, say), never the user's.
        where = {"NIGHTSHIFT_DATA_DIR": str(data_dir())}
        self.settings = Settings.from_env(
            {**where, **variables, "NIGHTSHIFT_DATABASE_URL": self._database.url}
        )
        with self._in_force():
            if batch is None:
                self.id = start_run(agent.name, run_input, deadline=parsed_deadline).run_id
            else:
                self.id = start_synthesis(agent.name, run_input, batch, parsed_deadline)
            self._go()

    def __repr__(self) -> str:
        return f"<AgentRun {self.agent.name} {self.id}: {self.status}>"

    # -- what a test reads ---------------------------------------------------------------------

    @property
    def status(self) -> RunStatus:
        return self._run().status

    @property
    def reason(self) -> str | None:
        """The stop reason (`completed`, `max_steps`, `config`...), or why it waits."""
        return self._run().stop_reason

    @property
    def error(self) -> str | None:
        return self._run().error

    @property
    def result(self) -> dict[str, Any] | None:
        return self._run().result

    @property
    def answer(self) -> str:
        """The run's final text (empty until it succeeded)."""
        return str((self.result or {}).get("text", ""))

    @property
    def waiting_on(self) -> str | None:
        return self._run().waiting_on

    @property
    def wake_at(self) -> datetime | None:
        """When a waiting run's timer is due, on the test's clock (`now`)."""
        wake_at = self._run().wake_at
        return None if wake_at is None else wake_at + self._moved

    @property
    def now(self) -> datetime:
        """The test's clock: the wall clock plus every `advance` so far."""
        return datetime.now(UTC) + self._moved

    @property
    def step(self) -> int:
        return self._run().step

    @property
    def state(self) -> dict[str, Any]:
        """The run's small structured state as its last checkpoint left it: the agent state its
        tools kept (a plan, facts) and its artifacts' references (`artifacts`)."""
        return self._run().state

    @property
    def journal(self) -> list[jr.Entry]:
        with self._reading() as session:
            rows = session.execute(
                select(JournalEntry.key, JournalEntry.step, JournalEntry.step_name,
                       JournalEntry.payload)
                .where(JournalEntry.run_id == self.id).order_by(JournalEntry.id)
            ).all()  # fmt: skip
        return [jr.Entry(r.key, r.step, r.step_name, r.payload) for r in rows]

    @property
    def calls(self) -> list[Call]:
        """Each tool call the model made and what it got back, in order."""
        journal = self._journal()
        found = []
        for entry in journal.entries:
            if entry.step_name != jr.MODEL_STEP:
                continue
            for block in dispatch.tool_uses(entry.payload):
                result = journal.replay(jr.tool_key(block["id"]), block["name"])
                if result is not None:
                    found.append(Call(block["id"], entry.step, block["name"], block["input"],
                                      result["content"], result["is_error"]))  # fmt: skip
        return found

    @property
    def actions(self) -> list[Action]:
        with self._reading() as session:
            rows = session.scalars(
                select(ActionRow)
                .where(ActionRow.run_id == self.id, ActionRow.kind == ActionKind.TOOL)
                .order_by(ActionRow.created_at)
            ).all()
        return [self._action(row) for row in rows]

    def _action(self, row: ActionRow) -> Action:
        key = row.idempotency_key
        return Action(
            key=key,
            tool=row.tool,
            service=row.service,
            args=row.args,
            requires_approval=row.requires_approval,
            approvers=tuple(row.approvers or ()),
            state=row.state,
            calls=tuple(call for call, its in self._recorder.keys.items() if its == key),
            sends=self._recorder.sends[key],
            result=row.result,
            decided_by=row.decided_by,
            note=row.note,
        )

    @property
    def pending(self) -> list[Action]:
        """The actions waiting for a person's approval."""
        return [a for a in self.actions if a.state is ActionState.PENDING_APPROVAL]

    @property
    def messages(self) -> list[Message]:
        """The conversation so far, as the model sees it."""
        return self._journal().messages(self.agent, self.input, self.step + 1, remember=False)

    @property
    def artifacts(self) -> dict[str, str]:
        """The run's artifacts (a report, a large output), by name, as text."""
        with self._reading() as session:
            rows = session.execute(
                select(Artifact.name, Artifact.content)
                .where(Artifact.run_id == self.id).order_by(Artifact.id)
            ).all()  # fmt: skip
        return {r.name: (r.content or b"").decode(errors="replace") for r in rows}

    # -- what a person does --------------------------------------------------------------------

    def approve(self, key: str | None = None, *, by: str = "tester") -> AgentRun:
        """Approve the pending action (`key`: which, when several are) as `by`, through the
        decision the API makes (only an approver may), and go on with the run."""
        return self._decide(key, ActionState.PENDING_APPROVAL, Decision.APPROVE, by, None)

    def reject(
        self, key: str | None = None, *, by: str = "tester", note: str | None = None
    ) -> AgentRun:
        """Reject the pending action; the model reads why, and the run goes on."""
        return self._decide(key, ActionState.PENDING_APPROVAL, Decision.REJECT, by, note)

    def resolve(
        self, key: str | None = None, *, happened: bool, by: str = "tester", note: str | None = None
    ) -> AgentRun:
        """Say whether an action whose outcome is unknown happened (a person checked the
        service), and go on with the run."""
        decision = Decision.HAPPENED if happened else Decision.DID_NOT_HAPPEN
        return self._decide(key, ActionState.OUTCOME_UNKNOWN, decision, by, note)

    def advance(
        self, *, days: float = 0, hours: float = 0, minutes: float = 0, seconds: float = 0
    ) -> AgentRun:
        """Move the clock forward (PostgreSQL's and the step's alike), run the tick as beat
        would, and go on with whatever it made runnable: due timers, deadlines that passed,
        key retention windows that closed."""
        by = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        move_forward(self._database.url, by)
        self._moved += by
        with self._in_force():
            tick(self.settings)
            self._go()
        return self

    def _decide(
        self, key: str | None, state: ActionState, decision: Decision, by: str, note: str | None
    ) -> AgentRun:
        waiting = [a for a in self.actions if a.state is state and key in (None, a.key)]
        if len(waiting) != 1:
            keys = ", ".join(a.key for a in self.actions if a.state is state) or "none"
            raise AssertionError(f"which action? {state}: {keys}")
        with self._in_force():
            decide(waiting[0].key, decision, Actor(by, DECIDED_VIA), note)
            self._go()
        return self

    # -- moving it -----------------------------------------------------------------------------

    @contextmanager
    def _in_force(self) -> Iterator[None]:
        """This run's settings, agent and step queue, for every thread of the process."""
        with (
            get_settings.replaced_by(self.settings),
            registry.replaced_by(self._registry),
            step_queue.replaced_by(self._queue),
        ):
            yield

    def _go(self) -> None:
        self._queue.run_all(self.settings, most=4 * self.agent.max_steps + 20)
        if self._recorder.failures:
            raise self._recorder.failures[0]

    @contextmanager
    def _reading(self) -> Iterator[Any]:
        with self._in_force(), read_only() as session:
            yield session

    def _run(self) -> Run:
        with self._reading() as session:
            run = session.get_one(Run, self.id)
            session.expunge(run)
        return run

    def _journal(self) -> jr.Journal:
        entries = self.journal
        return jr.Journal(self.id, entries, {e.key: e for e in entries})
