"""Retention: old finished runs keep a compact record and lose their bulky payloads and files.

A run is compacted when it finished more than NIGHTSHIFT_RETENTION_DAYS (default 30) ago.
Kept: the run row (status, result, stop_reason, error, usage, input) and every action row
(state, decision, decided_by, result). Replaced: each journal payload, by
`{"compacted": true, "summary": <its one-line summary>}`. Deleted: artifact files (the rows
stay, with `deleted_at`), the run's progress-feed events and its settled notifications. A run
with an open obligation (an action pending approval, attempted or with an unknown outcome) is
never compacted: someone may still need the details.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Text, and_, cast, delete, exists, func, or_, select, true, update
from sqlalchemy.orm import Session

from models import (
    Action,
    ActionState,
    Artifact,
    JournalEntry,
    Notification,
    Run,
    RunEvent,
    RunStatus,
)
from pipeline.db import transaction
from pipeline.errors import SettingsError
from pipeline.runs.summaries import summarize
from pipeline.settings import Settings, get_settings

log = logging.getLogger("nightshift.retention")

_SETTLED_NOTIFICATIONS = (ActionState.CONFIRMED, ActionState.FAILED)

OPEN_OBLIGATIONS = (
    ActionState.PENDING_APPROVAL,
    ActionState.ATTEMPTED,
    ActionState.OUTCOME_UNKNOWN,
)


@dataclass(frozen=True)
class RetentionConfig:
    days: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetentionConfig:
        raw = (os.environ if env is None else env).get("NIGHTSHIFT_RETENTION_DAYS") or "30"
        try:
            days = float(raw)
        except ValueError:
            raise SettingsError(
                f"NIGHTSHIFT_RETENTION_DAYS must be a number (got {raw!r})"
            ) from None
        if days < 1:
            raise SettingsError(f"NIGHTSHIFT_RETENTION_DAYS must be at least 1 (got {raw!r})")
        return cls(days=days)


@dataclass(frozen=True)
class RunCleanup:
    """What compaction takes (or, in a dry run, would take) from one run."""

    run_id: uuid.UUID
    agent: str
    status: str
    finished_at: datetime
    journal_entries: int
    journal_bytes: int
    artifact_files: int
    artifact_bytes: int


@dataclass(frozen=True)
class KeptRun:
    run_id: uuid.UUID
    agent: str
    status: str
    finished_at: datetime
    reason: str


@dataclass(frozen=True)
class CleanupReport:
    cutoff: datetime
    dry_run: bool
    compacted: list[RunCleanup] = field(default_factory=list)
    kept: list[KeptRun] = field(default_factory=list)
    """Old enough, but with an open obligation: left whole."""
    left_in_place: list[str] = field(default_factory=list)
    """Artifact files outside the artifact directory: not nightshift's to delete."""


def cleanup(
    older_than: timedelta | None = None,
    *,
    dry_run: bool = False,
    settings: Settings | None = None,
    limit: int = 1000,
) -> CleanupReport:
    """Compact up to `limit` old finished runs; a dry run only reports what would go."""
    settings = settings or get_settings()
    age = older_than if older_than is not None else timedelta(days=RetentionConfig.from_env().days)
    with transaction() as session:
        cutoff = session.execute(select(func.now())).scalar_one() - age
        candidates = _candidates_txn(session, cutoff, limit)
        kept = _kept_txn(session, cutoff, limit)
    report = CleanupReport(cutoff=cutoff, dry_run=dry_run, kept=kept)
    for candidate in candidates:
        if dry_run:
            report.compacted.append(candidate)
            continue
        with transaction() as session:
            if _compact_txn(session, candidate.run_id, settings.artifact_dir, report):
                report.compacted.append(candidate)
    if not dry_run and report.compacted:
        log.info("retention: compacted %d run(s) finished before %s", len(report.compacted), cutoff)
    return report


def _old_finished(cutoff: datetime) -> Any:
    finished = func.coalesce(Run.finished_at, Run.updated_at)
    return and_(Run.status.in_(RunStatus.terminal()), finished < cutoff)


def _open_obligation() -> Any:
    return exists().where(Action.run_id == Run.id, Action.state.in_(OPEN_OBLIGATIONS))


def _candidates_txn(session: Session, cutoff: datetime, limit: int) -> list[RunCleanup]:
    journal = (
        select(
            func.count().label("entries"),
            func.coalesce(func.sum(func.octet_length(cast(JournalEntry.payload, Text))), 0),
        )
        .where(JournalEntry.run_id == Run.id, JournalEntry.compacted.is_(False))
        .lateral()
    )
    files = (
        select(func.count().label("files"), func.coalesce(func.sum(Artifact.size), 0))
        .where(Artifact.run_id == Run.id, Artifact.deleted_at.is_(None))
        .lateral()
    )
    rows = session.execute(
        select(
            Run.id,
            Run.agent,
            Run.status,
            func.coalesce(Run.finished_at, Run.updated_at),
            *journal.c,
            *files.c,
        )
        .select_from(Run)
        .join(journal, true())
        .join(files, true())
        .where(_old_finished(cutoff), ~_open_obligation())
        .where(or_(journal.c.entries > 0, files.c.files > 0))
        .order_by(Run.finished_at)
        .limit(limit)
    ).all()
    return [
        RunCleanup(r[0], r[1], str(r[2]), r[3], int(r[4]), int(r[5]), int(r[6]), int(r[7]))
        for r in rows
    ]


def _kept_txn(session: Session, cutoff: datetime, limit: int) -> list[KeptRun]:
    rows = session.execute(
        select(
            Run.id,
            Run.agent,
            Run.status,
            func.coalesce(Run.finished_at, Run.updated_at),
            Action.state,
            func.count(),
        )
        .join(Action, Action.run_id == Run.id)
        .where(_old_finished(cutoff), Action.state.in_(OPEN_OBLIGATIONS))
        .group_by(Run.id, Action.state)
        .order_by(Run.id)
        .limit(limit)
    ).all()
    kept: dict[uuid.UUID, KeptRun] = {}
    for run_id, agent, status, finished, state, count in rows:
        what = f"{count} action(s) {state}"
        previous = kept.get(run_id)
        reason = f"{previous.reason}, {what}" if previous else what
        kept[run_id] = KeptRun(run_id, agent, str(status), finished, reason)
    return list(kept.values())


def _compact_txn(session: Session, run_id: uuid.UUID, root: Path, report: CleanupReport) -> bool:
    """Compact one run under its row lock; False if it gained an obligation meanwhile."""
    locked = session.execute(
        select(Run.id).where(Run.id == run_id, ~_open_obligation()).with_for_update()
    ).scalar_one_or_none()
    if locked is None:
        return False
    entries = session.execute(
        select(JournalEntry.id, JournalEntry.key, JournalEntry.payload).where(
            JournalEntry.run_id == run_id, JournalEntry.compacted.is_(False)
        )
    ).all()
    if entries:
        session.execute(
            update(JournalEntry),
            [
                {"id": e.id, "payload": compacted_payload(e.key, e.payload), "compacted": True}
                for e in entries
            ],
        )
    _delete_files_txn(session, run_id, root, report)
    # The progress feed and the delivered (or abandoned) notifications served people while
    # the run was live; the journal's summaries and the run row are its record now.
    session.execute(delete(RunEvent).where(RunEvent.run_id == run_id))
    session.execute(
        delete(Notification).where(
            Notification.run_id == run_id, Notification.state.in_(_SETTLED_NOTIFICATIONS)
        )
    )
    return True


def compacted_payload(key: str, payload: dict[str, Any]) -> dict[str, Any]:
    """What a journal entry keeps: its one-line summary."""
    try:
        summary = summarize(key, payload)
    except (KeyError, TypeError, AttributeError):
        summary = key
    return {"compacted": True, "summary": summary}


def _delete_files_txn(
    session: Session, run_id: uuid.UUID, root: Path, report: CleanupReport
) -> None:
    # Files go before the commit: if the commit fails, the next cleanup finds them missing
    # and only marks the rows; the other order could leave files that nothing points at.
    artifacts = session.execute(
        select(Artifact.id, Artifact.path).where(
            Artifact.run_id == run_id, Artifact.deleted_at.is_(None)
        )
    ).all()
    root = root.resolve()
    deleted = []
    for artifact_id, raw in artifacts:
        path = Path(raw).resolve()
        if not path.is_relative_to(root):
            report.left_in_place.append(raw)
            continue
        path.unlink(missing_ok=True)
        deleted.append(artifact_id)
        if path.parent != root:
            _remove_if_empty(path.parent)
    if deleted:
        session.execute(
            update(Artifact).where(Artifact.id.in_(deleted)).values(deleted_at=func.now())
        )


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty, or already gone
        folder.rmdir()
