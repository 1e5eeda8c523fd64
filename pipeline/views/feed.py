"""The progress feed: what happened to a run or a batch, in order, from committed rows only.

Events come from `run_events` (models/run_event.py), which triggers write in the transaction of
each change, so the feed never shows what did not happen. Each event has a position (its
transaction's id, its row's id; written as one number, POSITION): events are read in that
order, and only those of transactions older than every write transaction still open in this
database (the horizon). A transaction that commits later therefore always lands after every
position already read, and a reader that resumes from the last position it saw (SSE's
Last-Event-ID) misses nothing and sees nothing twice.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from models import RunStatus
from pipeline.db import read_only
from pipeline.errors import InvalidInput, RunNotFound, UnknownBatch
from pipeline.keys import EntryKind, entry_kind
from pipeline.runs.summaries import describe, summarize

Position = tuple[int, int]
START: Position = (0, 0)
_ROW_DIGITS = 19
"""A row id is a bigint: 19 digits at most."""
POSITION = re.compile(r"^(?:[0-9]{1,39}|[0-9]{1,20}-[0-9]{1,19})$")
"""How an event id is written: the transaction id (xid8, 20 digits at most) followed by the row
id in 19 digits, one number (`0` is the beginning), so that it is digits only, as a header value
generated from the API document's pattern can be; and the earlier `<xid>-<id>`, which a client
that started following before that change still resumes with."""

# The oldest write transaction still open in this database, from the statement's own snapshot.
# Transactions of other databases (which never write run_events) are left out when
# pg_stat_activity shows them; one it does not show only makes the horizon more cautious.
_HORIZON = """
    SELECT coalesce(
        (SELECT min(x::text::bigint) FROM pg_snapshot_xip(pg_current_snapshot()) AS x
          WHERE x::text::bigint % 4294967296 NOT IN (
                SELECT backend_xid::text::bigint FROM pg_stat_activity
                 WHERE backend_xid IS NOT NULL AND datname <> current_database())),
        pg_snapshot_xmax(pg_current_snapshot())::text::bigint)
"""
_TERMINAL = ", ".join(f"'{s.value}'" for s in RunStatus.terminal())
_SCOPES = {
    "run": "e.run_id = :run_id",
    # A batch's children, its synthesis (which is no child) and the batch's own changes.
    "batch": """(e.batch_id = :batch_id OR e.run_id = ANY(ARRAY(
        SELECT id FROM runs WHERE batch_id = :batch_id
        UNION ALL SELECT synthesis_run_id FROM batches
         WHERE id = :batch_id AND synthesis_run_id IS NOT NULL)))""",
}
_DONE = {
    "run": f"(SELECT status IN ({_TERMINAL}) FROM runs WHERE id = :run_id)",
    "batch": f"""(SELECT b.status IN ('succeeded', 'failed', 'stopped') AND NOT EXISTS (
        SELECT 1 FROM runs r WHERE (r.batch_id = b.id OR r.id = b.synthesis_run_id)
           AND r.status NOT IN ({_TERMINAL})) FROM batches b WHERE b.id = :batch_id)""",
}


@dataclass(frozen=True)
class Subject:
    """Whose events: one run, or one batch with all its runs."""

    run_id: uuid.UUID | None = None
    batch_id: str | None = None

    @property
    def scope(self) -> str:
        return "run" if self.run_id is not None else "batch"

    def params(self) -> dict[str, Any]:
        return {"run_id": self.run_id} if self.run_id is not None else {"batch_id": self.batch_id}


@dataclass(frozen=True)
class FeedEvent:
    position: Position
    type: str
    """run_started, step_started, model_replied, tool_result, note, timer_set,
    action_changed, version_changed, waiting, resumed, finished or batch_changed."""
    run_id: str | None
    batch_id: str | None
    at: datetime
    data: dict[str, Any]

    @property
    def id(self) -> str:
        return format_position(self.position)

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "run_id": self.run_id,
            "batch_id": self.batch_id,
            "at": self.at.isoformat(),
            **self.data,
        }


def format_position(position: Position) -> str:
    xid, row = position
    return str(xid * 10**_ROW_DIGITS + row)


def parse_position(given: str | None) -> Position:
    """A position this feed wrote (see POSITION); None means the beginning."""
    if given is None:
        return START
    if not POSITION.fullmatch(given):
        raise InvalidInput(
            f"event id {given[:40]!r} is not a position of this feed (an id it sent, or 0)"
        )
    if "-" in given:
        xid, _, row = given.partition("-")
        return int(xid), int(row)
    xid, row = divmod(int(given), 10**_ROW_DIGITS)
    return xid, row


def check_subject(subject: Subject) -> None:
    """RunNotFound or UnknownBatch unless the run or batch exists."""
    with read_only() as session:
        if subject.run_id is not None:
            found = session.execute(
                text("SELECT 1 FROM runs WHERE id = :run_id"), subject.params()
            ).first()
            if found is None:
                raise RunNotFound(f"no run has id {subject.run_id}")
        elif (
            session.execute(
                text("SELECT 1 FROM batches WHERE id = :batch_id"), subject.params()
            ).first()
            is None
        ):
            raise UnknownBatch(f"no batch has id {subject.batch_id!r}")


@dataclass(frozen=True)
class Page:
    events: list[FeedEvent]
    done: bool
    """The run (or the batch and every run of it) has finished and every one of its events
    was read: the feed has nothing more to say."""


def read(subject: Subject, after: Position = START, limit: int = 500) -> Page:
    """The next events after `after`, oldest first."""
    with read_only() as session:
        events = _events_txn(session, subject, after, limit)
        done = False if events else _done_txn(session, subject, after)
    return Page(events, done)


def latest_position() -> Position:
    """Where a reader that has just read the current state should start following: the
    horizon. Every event of a transaction older than it is committed, so a state read after
    this includes it; every event at or above it is still to come (it may repeat a change the
    state already shows: the pages drop those). The same for every subject, and no event is
    read for it: a batch of ten thousand runs costs what one run does."""
    with read_only() as session:
        horizon = session.execute(text(f"SELECT ({_HORIZON})")).scalar_one()
    return (int(horizon), 0)


def _events_txn(session: Session, subject: Subject, after: Position, limit: int) -> list[FeedEvent]:
    query = text(
        f"""
        SELECT e.id, e.xid, e.run_id, e.batch_id, e.kind, e.data, e.created_at,
               j.key AS journal_key, j.payload AS journal_payload, r.result AS result
          FROM run_events e
          LEFT JOIN journal j ON j.id = e.journal_id
          LEFT JOIN runs r ON r.id = e.run_id AND e.kind = 'status'
               AND e.data->>'status' IN ({_TERMINAL})
         WHERE {_SCOPES[subject.scope]}
           AND (e.xid, e.id) > (:after_xid, :after_id)
           AND e.xid < ({_HORIZON})
         ORDER BY e.xid, e.id
         LIMIT :limit
        """
    )
    rows = session.execute(
        query,
        {**subject.params(), "after_xid": after[0], "after_id": after[1], "limit": limit},
    ).all()
    return [_event(row) for row in rows]


def _done_txn(session: Session, subject: Subject, after: Position) -> bool:
    # In one statement: a finished subject whose last events are committed but not yet
    # past the horizon is not done until they have been read.
    query = text(
        f"""
        SELECT coalesce({_DONE[subject.scope]}, true) AND NOT EXISTS (
               SELECT 1 FROM run_events e
                WHERE {_SCOPES[subject.scope]} AND (e.xid, e.id) > (:after_xid, :after_id))
        """
    )
    params = {**subject.params(), "after_xid": after[0], "after_id": after[1]}
    return bool(session.execute(query, params).scalar_one())


def _event(row: Any) -> FeedEvent:
    data = dict(row.data)
    kind: str = row.kind
    if kind == "journal":
        data["summary"] = summarize(row.journal_key, row.journal_payload)
        data["text"] = describe(row.journal_key, row.journal_payload)
        if (row.journal_payload or {}).get("is_error"):
            data["is_error"] = True
    elif kind == "status" and row.result is not None:
        data["result"] = row.result
    elif kind == "action":
        # Anyone who may read the run reads its feed, and who decided is shown only to who may
        # decide (pipeline.runs.decisions.shown_to): the action's page says it to them.
        data.pop("decided_by", None)
    return FeedEvent(
        position=(row.xid, row.id),
        type=_type(kind, data),
        run_id=None if row.run_id is None else str(row.run_id),
        batch_id=row.batch_id,
        at=row.created_at,
        data=data,
    )


_JOURNAL_TYPES = {
    EntryKind.MODEL: "model_replied",
    EntryKind.TOOL: "tool_result",
    EntryKind.NOTE: "note",
    EntryKind.TIMER: "timer_set",
}
_FIXED_TYPES = {
    "created": "run_started",
    "claimed": "step_started",
    "action": "action_changed",
    "batch": "batch_changed",
    "version": "version_changed",
}


TYPES = (
    *_FIXED_TYPES.values(), *_JOURNAL_TYPES.values(), "waiting", "resumed", "finished",
)  # fmt: skip
"""Every event type the feed has (`_type`)."""


def _type(kind: str, data: dict[str, Any]) -> str:
    if kind in _FIXED_TYPES:
        return _FIXED_TYPES[kind]
    if kind == "journal":
        journal_kind = entry_kind(data["key"])
        return _JOURNAL_TYPES.get(journal_kind, "note") if journal_kind else "note"
    status = RunStatus(data["status"])
    if status.is_terminal():
        return "finished"
    return "waiting" if status.is_parked() else "resumed"
