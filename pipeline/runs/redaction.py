"""Compaction of one run: what retention's first stage takes from the durable record.

A compacted run keeps its outcome: its result, error, status, usage and costs, its actions'
states, decisions and approvals, and their arguments and results, all without the fields its
agent declares personal (Agent.personal_data). What goes whole is the bulky intermediate
output: the journal's payloads (each keeps an outline: which model call or tool, tokens, ok or
error, none of the text), its artifacts' contents, the payloads of the events that started it
(another service's message, which no agent declares), its progress feed and its settled
webhooks. A run of an agent this process does not know (or an action of a tool its agent
no longer has) loses its input, state, result, arguments and results whole: nobody declares
their fields any more.

An open obligation (an action pending approval, attempted or with an unknown outcome) keeps its
key, state and arguments, which a lookup, a resend or a person deciding still needs, and an owed
webhook keeps its body and URL; the next compaction after they settle redacts them.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Boolean, and_, not_, select
from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import Action, ActionKind, ActionState, JournalEntry, Run
from pipeline.agent_definition import Agent
from pipeline.errors import UnknownAgent
from pipeline.logs import get_logger
from pipeline.registry import get_agent
from pipeline.runs.summaries import outline

log = get_logger("nightshift.retention")

OPEN_OBLIGATIONS = (
    ActionState.PENDING_APPROVAL,
    ActionState.ATTEMPTED,
    ActionState.OUTCOME_UNKNOWN,
)
OWED_WEBHOOKS = (ActionState.INTENDED, ActionState.ATTEMPTED, ActionState.OUTCOME_UNKNOWN)

REDACTED: dict[str, Any] = {"redacted": True}
"""What a wholly redacted JSON column holds."""
REDACTED_TEXT = "[redacted]"
"""What a dropped field holds (null stays null: nothing was there)."""


def settled_action() -> Any:
    """A tool's action nobody owes anything for any more: retention may take its details. (A
    webhook is the run's announcement, not its obligation: compaction deletes it once settled,
    and an owed one keeps no run from retention.)"""
    return and_(Action.kind == ActionKind.TOOL, not_(Action.state.in_(OPEN_OBLIGATIONS)))


def open_obligation() -> Any:
    """A tool's action someone still owes something for: its run's record stays."""
    return and_(Action.kind == ActionKind.TOOL, Action.state.in_(OPEN_OBLIGATIONS))


def unredacted_action() -> Any:
    """A settled action whose personal data is still there (its run was compacted while it was
    open, or not yet)."""
    return and_(settled_action(), Action.compacted_at.is_(None))


def outlined() -> Any:
    """A journal entry already reduced to its outline."""
    return JournalEntry.payload.op("?", return_type=Boolean)("outline")


def without(document: Any, fields: Iterable[str]) -> Any:
    """A copy of `document` whose value at each of `fields` (dotted, `*` for every item or
    value: PersonalData) is REDACTED_TEXT; a field the document lacks drops nothing."""
    kept = copy.deepcopy(document)
    for field in fields:
        _drop(kept, field.split("."))
    return kept


def _drop(value: Any, path: list[str]) -> None:
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        keys = list(value) if head == "*" else [head] if head in value else []
    elif isinstance(value, list) and head == "*":
        keys = list(range(len(value)))
    else:
        return
    for key in keys:
        if rest:
            _drop(value[key], rest)
        elif value[key] is not None:
            value[key] = REDACTED_TEXT


def compact_run_txn(session: Session, run_id: uuid.UUID) -> None:
    """Compact one run's record (the caller holds the run's row lock):
    models/sql/retention.sql."""
    run = session.execute(
        select(Run.agent, Run.input, Run.state, Run.result).where(Run.id == run_id)
    ).one()
    agent = _agent(run.agent)
    declared = agent.personal_data if agent is not None else None
    values = _values()
    statements.execute(
        session,
        "redact_run",
        run_id=run_id,
        input=_kept(run.input, declared.input if declared else None),
        state=_kept(run.state, declared.state if declared else None),
        result=_kept(run.result, declared.of_result() if declared else None),
        owed=values["owed"],
    )
    _outline_journal_txn(session, run_id)
    _redact_actions_txn(session, run_id, agent)
    statements.execute(session, "redact_run_events", run_id=run_id, **values)


def _agent(name: str) -> Agent | None:
    """The run's agent, None for one this process does not know (retired, or not registered
    where retention runs): what it carried goes whole, nobody says which fields are personal."""
    try:
        return get_agent(name)
    except UnknownAgent:
        log.warning("retention: agent %s is not registered here; its runs are redacted whole",
                    name)  # fmt: skip
        return None


def _kept(document: Any, fields: Iterable[str] | None) -> Any:
    """The JSON parameter of what compaction keeps of a document: all but `fields`; with no
    declaration (None), nothing (REDACTED). SQL NULL stays NULL: nothing was there."""
    if document is None:
        return None
    return statements.jsonb(REDACTED if fields is None else without(document, fields))


def _redact_actions_txn(session: Session, run_id: uuid.UUID, agent: Agent | None) -> None:
    actions = session.execute(
        select(Action.id, Action.tool, Action.args, Action.result)
        .where(Action.run_id == run_id)
        .where(unredacted_action())
    ).all()
    if not actions:
        return
    args, results = [], []
    for action in actions:
        known = agent is not None and agent.tool(action.tool) is not None
        declared = agent.personal_data if agent is not None and known else None
        args.append(_kept(action.args, declared.of_tool(action.tool, "args") if declared else None))
        result = declared.of_tool(action.tool, "result") if declared else None
        results.append(_kept(action.result, result))
    statements.execute(
        session,
        "redact_actions",
        ids=[a.id for a in actions],
        args=args,
        results=results,
        open=_values()["open"],
    )


def _values() -> dict[str, Any]:
    """What the retention statements redact with, and which states they spare."""
    return {
        "redacted": statements.jsonb(REDACTED),
        "open": [state.value for state in OPEN_OBLIGATIONS],
        "owed": [state.value for state in OWED_WEBHOOKS],
    }


def _outline_journal_txn(session: Session, run_id: uuid.UUID) -> None:
    entries = session.execute(
        select(JournalEntry.id, JournalEntry.key, JournalEntry.step_name, JournalEntry.payload)
        .where(JournalEntry.run_id == run_id)
        .where(~outlined())
    ).all()
    if entries:
        statements.execute(
            session,
            "outline_journal",
            ids=[e.id for e in entries],
            payloads=[
                statements.jsonb(compacted_payload(e.key, e.step_name, e.payload)) for e in entries
            ],
        )


def compacted_payload(key: str, step_name: str, payload: dict[str, Any]) -> dict[str, Any]:
    """What a journal entry keeps: its outline, none of the text it carried."""
    return {"compacted": True, "outline": True, "summary": outline(key, step_name, payload)}


def delete_artifacts_txn(session: Session, run_id: uuid.UUID) -> None:
    """Delete a run's artifact contents, in the compaction's transaction; the rows stay, with
    `deleted_at`, as the record of what existed (name, size, hash)."""
    statements.execute(session, "delete_artifact_contents", run_id=run_id)
