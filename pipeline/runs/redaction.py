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

from sqlalchemy import Boolean, and_, case, delete, func, literal, not_, select, update
from sqlalchemy.orm import Session

from models import (
    Action,
    ActionAudit,
    ActionState,
    Artifact,
    ExternalEvent,
    JournalEntry,
    Notification,
    Run,
    RunEvent,
)
from models.base import JsonB
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
    """Redact one run's record (the caller holds the run's row lock)."""
    _redact_run_txn(session, run_id)
    _outline_journal_txn(session, run_id)
    _redact_actions_txn(session, run_id)
    session.execute(
        update(ExternalEvent).where(ExternalEvent.run_id == run_id).values(payload=REDACTED)
    )
    # The progress feed and the delivered (or abandoned) notifications served people while
    # the run was live; the outlines and the run row are its record now.
    session.execute(delete(RunEvent).where(RunEvent.run_id == run_id))
    session.execute(
        delete(Notification).where(
            Notification.run_id == run_id, ~Notification.state.in_(OWED_NOTIFICATIONS)
        )
    )


def _redact_run_txn(session: Session, run_id: uuid.UUID) -> None:
    owed = (
        select(Notification.id)
        .where(Notification.run_id == run_id, Notification.state.in_(OWED_NOTIFICATIONS))
        .exists()
    )
    session.execute(
        update(Run)
        .where(Run.id == run_id)
        .values(
            input=REDACTED,
            state=REDACTED,
            result=_redacted_json(Run.result),
            error=_redacted_text(Run.error),
            # An owed notification is still sent to the URL; a settled one needs it no more.
            notify_url=case((owed, Run.notify_url), else_=None),
            compacted_at=func.coalesce(Run.compacted_at, func.now()),
        )
        .execution_options(synchronize_session=False)
    )


def _outline_journal_txn(session: Session, run_id: uuid.UUID) -> None:
    entries = session.execute(
        select(JournalEntry.id, JournalEntry.key, JournalEntry.step_name, JournalEntry.payload)
        .where(JournalEntry.run_id == run_id)
        .where(~outlined())
    ).all()
    if entries:
        session.execute(
            update(JournalEntry),
            [
                {
                    "id": e.id,
                    "payload": compacted_payload(e.key, e.step_name, e.payload),
                    "compacted": True,
                }
                for e in entries
            ],
        )


def compacted_payload(key: str, step_name: str, payload: dict[str, Any]) -> dict[str, Any]:
    """What a journal entry keeps: its outline, none of the text it carried."""
    return {"compacted": True, "outline": True, "summary": outline(key, step_name, payload)}


def _redact_actions_txn(session: Session, run_id: uuid.UUID) -> None:
    redacted = session.scalars(
        update(Action)
        .where(Action.run_id == run_id, unredacted_action())
        .values(
            args=REDACTED,
            result=_redacted_json(Action.result),
            error=_redacted_text(Action.error),
            note=_redacted_text(Action.note),
        )
        .returning(Action.idempotency_key)
        .execution_options(synchronize_session=False)
    ).all()
    if redacted:
        session.execute(
            update(ActionAudit)
            .where(ActionAudit.action_key.in_(redacted))
            .values(note=_redacted_text(ActionAudit.note))
        )


def _redacted_json(column: Any) -> Any:
    """REDACTED where the column holds something; NULL stays NULL (nothing was there)."""
    return case((column.is_(None), None), else_=literal(REDACTED, JsonB))


def _redacted_text(column: Any) -> Any:
    return case((column.is_(None), None), else_=REDACTED_TEXT)


def delete_artifacts_txn(session: Session, run_id: uuid.UUID) -> None:
    """Delete a run's artifact contents, in the compaction's transaction; the rows stay, with
    `deleted_at`, as the record of what existed (name, size, hash)."""
    session.execute(
        update(Artifact)
        .where(Artifact.run_id == run_id, Artifact.deleted_at.is_(None))
        .values(content=None, deleted_at=func.now())
    )
