"""Retention, in two stages: personal data goes, then the record itself.

1. Compaction: a run that finished more than NIGHTSHIFT_RETENTION_DAYS (default 30) ago keeps
   its outcome (result, error, status, usage and cost, its actions' states, decisions and
   approvals) and loses the fields its agent declares personal and its bulky intermediate
   outputs: journal payloads, artifacts' contents (pipeline/runs/redaction.py), except what
   its open obligations still need.
2. Deletion: a compact record goes NIGHTSHIFT_RETENTION_DELETE_DAYS (default 365) after its
   compaction, unless it still has an open obligation (pipeline/runs/deletion.py).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Text, and_, cast, func, or_, select, true
from sqlalchemy.orm import Session

from models import Action, Artifact, JournalEntry, Run, RunStatus
from pipeline.db import transaction
from pipeline.runs.deletion import DeletedRun, deletable_txn, delete_run_txn
from pipeline.runs.redaction import (
    compact_run_txn,
    delete_artifacts_txn,
    open_obligation,
    outlined,
    unredacted_action,
)
from pipeline.settings import Settings, get_settings

log = logging.getLogger("nightshift.retention")


@dataclass(frozen=True)
class RunCleanup:
    """What compaction takes (or, in a dry run, would take) from one run."""

    run_id: uuid.UUID
    agent: str
    status: str
    finished_at: datetime
    journal_entries: int
    journal_bytes: int
    artifacts: int
    artifact_bytes: int
    actions: int
    """Settled actions whose arguments and results lose their declared personal fields."""


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
    delete_cutoff: datetime
    """Compacted before this: deleted."""
    compacted: list[RunCleanup] = field(default_factory=list)
    deleted: list[DeletedRun] = field(default_factory=list)
    kept: list[KeptRun] = field(default_factory=list)
    """Old enough, but with an open obligation: those actions keep their details and the run
    is not deleted."""


def cleanup(
    older_than: timedelta | None = None,
    *,
    dry_run: bool = False,
    delete_after: timedelta | None = None,
    settings: Settings | None = None,
    limit: int = 1000,
) -> CleanupReport:
    """Compact up to `limit` old finished runs, then delete up to `limit` compact records past
    their deletion window; a dry run only reports what would go."""
    settings = settings or get_settings()
    age = older_than if older_than is not None else timedelta(days=settings.retention_days)
    after = (
        delete_after if delete_after is not None else timedelta(days=settings.retention_delete_days)
    )
    with transaction() as session:
        now = session.execute(select(func.now())).scalar_one()
        candidates = _candidates_txn(session, now - age, limit)
        kept = _kept_txn(session, now - age, limit)
        doomed = deletable_txn(session, now - after, limit)
    report = CleanupReport(now - age, dry_run, now - after, kept=kept)
    if dry_run:
        report.compacted.extend(candidates)
        report.deleted.extend(doomed)
        return report
    for candidate in candidates:
        with transaction() as session:
            if _compact_txn(session, candidate.run_id, report):
                report.compacted.append(candidate)
    for record in doomed:
        with transaction() as session:
            if delete_run_txn(session, record.run_id, now - after):
                report.deleted.append(record)
    if report.compacted or report.deleted:
        log.info(
            "retention: compacted %d run(s) finished before %s, deleted %d compacted before %s",
            len(report.compacted), report.cutoff, len(report.deleted), report.delete_cutoff,
        )  # fmt: skip
    return report


def _old_finished(cutoff: datetime) -> Any:
    finished = func.coalesce(Run.finished_at, Run.updated_at)
    return and_(Run.status.in_(RunStatus.terminal()), finished < cutoff)


_FINISHED_RUN = (Run.id, Run.agent, Run.status, func.coalesce(Run.finished_at, Run.updated_at))
"""A finished run as the cleanup report names it: id, agent, status, when it finished."""


def _candidates_txn(session: Session, cutoff: datetime, limit: int) -> list[RunCleanup]:
    journal = (
        select(
            func.count().label("entries"),
            func.coalesce(func.sum(func.octet_length(cast(JournalEntry.payload, Text))), 0),
        )
        .where(JournalEntry.run_id == Run.id, ~outlined())
        .lateral()
    )
    files = (
        select(func.count().label("files"), func.coalesce(func.sum(Artifact.size), 0))
        .where(Artifact.run_id == Run.id, Artifact.deleted_at.is_(None))
        .lateral()
    )
    actions = (
        select(func.count().label("actions"))
        .where(Action.run_id == Run.id, unredacted_action())
        .lateral()
    )
    rows = session.execute(
        select(
            *_FINISHED_RUN,
            *journal.c,
            *files.c,
            *actions.c,
        )
        .select_from(Run)
        .join(journal, true())
        .join(files, true())
        .join(actions, true())
        .where(_old_finished(cutoff))
        .where(or_(Run.compacted_at.is_(None), actions.c.actions > 0))
        .order_by(Run.finished_at)
        .limit(limit)
    ).all()
    return [
        RunCleanup(r[0], r[1], str(r[2]), r[3], int(r[4]), int(r[5]), int(r[6]), int(r[7]),
                   int(r[8]))
        for r in rows
    ]  # fmt: skip


def _kept_txn(session: Session, cutoff: datetime, limit: int) -> list[KeptRun]:
    rows = session.execute(
        select(
            *_FINISHED_RUN,
            Action.state,
            func.count(),
        )
        .join(Action, Action.run_id == Run.id)
        .where(_old_finished(cutoff), open_obligation())
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


def _compact_txn(session: Session, run_id: uuid.UUID, report: CleanupReport) -> bool:
    """Compact one run under its row lock; False if it is no longer finished and old."""
    locked = session.execute(
        select(Run.id).where(Run.id == run_id, _old_finished(report.cutoff)).with_for_update()
    ).scalar_one_or_none()
    if locked is None:
        return False
    compact_run_txn(session, run_id)
    delete_artifacts_txn(session, run_id)
    return True
