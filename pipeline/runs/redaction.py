"""Compaction of one run: what retention's first stage takes from the durable record.

Everything a run carried for the people it served goes: its input, state, result and error
text, the journal's payloads (each keeps an outline: which model call or tool, tokens,
ok or error, none of the text), the arguments, results and notes of its settled actions, the
payloads of the events that started it, its progress feed, its settled notifications and its
artifacts' contents. An open obligation (an action pending approval, attempted or with an unknown
outcome) keeps its key, state and arguments, which a lookup, a resend or a person deciding
still needs, and an owed notification keeps its body and URL; the next compaction after they
settle redacts them.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Boolean, and_, not_, select
from sqlalchemy.orm import Session

import pipeline.statements as statements
from models import Action, ActionState, JournalEntry
from pipeline.runs.summaries import outline

OPEN_OBLIGATIONS = (
    ActionState.PENDING_APPROVAL,
    ActionState.ATTEMPTED,
    ActionState.OUTCOME_UNKNOWN,
)
OWED_NOTIFICATIONS = (ActionState.INTENDED, ActionState.ATTEMPTED, ActionState.OUTCOME_UNKNOWN)

REDACTED: dict[str, Any] = {"redacted": True}
"""What a redacted JSON column holds."""
REDACTED_TEXT = "[redacted]"
"""What a redacted text column holds (NULL stays NULL)."""


def settled_action() -> Any:
    """An action nobody owes anything for any more: retention may take its details."""
    return not_(Action.state.in_(OPEN_OBLIGATIONS))


def unredacted_action() -> Any:
    """A settled action whose details are still there (its run was compacted while it was
    open, or before compaction redacted)."""
    return and_(settled_action(), Action.args != REDACTED)


def outlined() -> Any:
    """A journal entry already reduced to its outline."""
    return JournalEntry.payload.op("?", return_type=Boolean)("outline")


def compact_run_txn(session: Session, run_id: uuid.UUID) -> None:
    """Redact one run's record (the caller holds the run's row lock): models/sql/retention.sql."""
    values = _values()
    statements.execute(session, "redact_run", run_id=run_id, **values)
    _outline_journal_txn(session, run_id)
    statements.execute(session, "redact_actions", run_id=run_id, **values)
    statements.execute(session, "redact_run_events", run_id=run_id, **values)


def _values() -> dict[str, Any]:
    """What the retention statements redact with, and which states they spare."""
    return {
        "redacted": statements.jsonb(REDACTED),
        "redacted_text": REDACTED_TEXT,
        "open": [state.value for state in OPEN_OBLIGATIONS],
        "owed": [state.value for state in OWED_NOTIFICATIONS],
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
