"""Retention's second stage deletes compact records past their window and nothing else; the tick
ends a run parked past the maximum wait with no deadline, whatever it waits on."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import and_, func, select, text

from models import (
    Action,
    ActionAudit,
    ActionKind,
    ActionState,
    Alert,
    Batch,
    ExternalEvent,
    JournalEntry,
    Run,
    RunEvent,
    RunStatus,
    ScheduleFire,
)
from models.status import FireDecision
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.runs.retention import cleanup
from pipeline.runs.start import create_run_txn
from pipeline.runs.tick import tick

REPORT = {"team": "ops", "date": "2026-11-29"}


def compacted_run(
    compacted_days_ago: float,
    *,
    open_action: bool = False,
    parent: uuid.UUID | None = None,
    batch: str | None = None,
) -> uuid.UUID:
    """A finished run compacted `compacted_days_ago` days ago, with rows in every table that
    points at a run."""
    with transaction() as session:
        run_id = create_run_txn(session, "nightly_report", REPORT, parent_id=parent,
                                batch_id=batch).run_id  # fmt: skip
        key = f"nightly_report:{run_id}"
        session.add(
            JournalEntry(
                run_id=run_id,
                key="model:0",
                step=0,
                step_name="ask_model",
                payload={"compacted": True, "outline": True, "summary": "m"},
            )
        )
        session.add(
            Action(
                idempotency_key=key,
                run_id=run_id,
                tool="send_report_email",
                service="email",
                args={"redacted": True},
                approvers=[],
                state=ActionState.OUTCOME_UNKNOWN if open_action else ActionState.CONFIRMED,
                compacted_at=None if open_action else func.now(),
            )
        )
        session.add(
            ActionAudit(
                action_key=key, run_id=run_id, event="approve", by="alice", via="cli (OS user)"
            )
        )
        session.add(
            ExternalEvent(
                source="billing", event_id=f"ev-{run_id}", run_id=run_id, payload={"redacted": True}
            )
        )
        session.add(
            ScheduleFire(
                schedule="nightly",
                slot=func.now() - timedelta(days=900),
                decision=FireDecision.FIRED,
                reason="due",
                run_id=run_id,
            )
        )
        session.add(Alert(kind="budget_tokens", subject=f"run:{run_id}", message="over"))
        session.add(Action(idempotency_key=f"run:{run_id}:finished", kind=ActionKind.WEBHOOK,
                           run_id=run_id, tool="run.finished", service="webhook",
                           args={"url": "http://receiver.invalid/", "event_id": 1},
                           state=ActionState.FAILED, requires_approval=False,
                           approvers=[]))  # fmt: skip
        session.flush()
        session.execute(
            text(
                "UPDATE runs SET status = 'succeeded', finished_at = now() - interval '900 days',"
                " compacted_at = now() - make_interval(days => :days) WHERE id = :id"
            ),
            {"days": compacted_days_ago, "id": run_id},
        )
    return run_id


def rows_of(run_id: uuid.UUID) -> dict[str, int]:
    """How many rows of each table belong to the run."""
    counted: dict[str, Any] = {
        "runs": Run.id == run_id,
        "journal": JournalEntry.run_id == run_id,
        "actions": Action.run_id == run_id,
        "action_audit": ActionAudit.run_id == run_id,
        "events": ExternalEvent.run_id == run_id,
        "schedule_fires": ScheduleFire.run_id == run_id,
        "alerts": Alert.subject == f"run:{run_id}",
        "webhooks": and_(Action.run_id == run_id, Action.kind == ActionKind.WEBHOOK),
        "run_events": RunEvent.run_id == run_id,
    }
    with transaction() as session:
        return {
            table: int(session.scalar(select(func.count()).where(where)) or 0)
            for table, where in counted.items()
        }


def orphaned_dedup_rows() -> tuple[int, int]:
    """Events and schedule fires that outlived their run: their de-duplication stays."""
    with transaction() as session:
        events = session.scalar(select(func.count()).where(ExternalEvent.run_id.is_(None)))
        fires = session.scalar(select(func.count()).where(ScheduleFire.run_id.is_(None)))
    return int(events or 0), int(fires or 0)


@pytest.fixture
def records(db_url: str) -> dict[str, uuid.UUID]:
    with transaction() as session:
        session.add(Batch(id="nightly:old", name="nightly"))
        session.add(Batch(id="nightly:shared", name="nightly"))
    parent = compacted_run(400)
    return {
        "old": compacted_run(400, batch="nightly:old"),
        "old, batch still has a recent run": compacted_run(400, batch="nightly:shared"),
        "recent": compacted_run(10, batch="nightly:shared"),
        "old, outcome unknown": compacted_run(400, open_action=True),
        "old parent": parent,
        "recent child": compacted_run(10, parent=parent),
    }


DELETED = {"old", "old, batch still has a recent run"}


def test_the_second_stage_deletes_old_compact_records_and_nothing_else(
    records: dict[str, uuid.UUID], capsys: pytest.CaptureFixture[str]
) -> None:
    before = {name: rows_of(run_id) for name, run_id in records.items()}
    assert all(count > 0 for counts in before.values() for count in counts.values())

    # a dry run lists what would go and deletes nothing
    names = {run_id: name for name, run_id in records.items()}
    assert {names[d.run_id] for d in cleanup(dry_run=True).deleted} == DELETED
    assert main(["retention", "--dry-run"]) == 0
    assert "would delete 2 compact record(s)" in capsys.readouterr().out
    assert {name: rows_of(run_id) for name, run_id in records.items()} == before

    # when retention runs with the default window (365 days after compaction)
    report = cleanup()

    # then exactly the old compact records are gone, with every row that pointed at them
    assert {names[d.run_id] for d in report.deleted} == DELETED
    for name, run_id in records.items():
        after = rows_of(run_id)
        if name in DELETED:
            assert set(after.values()) == {0}, name
        else:
            assert after == before[name], name
    assert orphaned_dedup_rows() == (2, 2), "events and schedule fires keep their slots"
    with transaction() as session:
        batches = set(session.scalars(select(Batch.id)))
    assert batches == {"nightly:shared"}, "a batch goes with its last run"
    assert cleanup().deleted == []


def parked_run(waiting_days: float, wake_in_days: float | None = None) -> uuid.UUID:
    with transaction() as session:
        run_id = create_run_txn(session, "nightly_report", REPORT).run_id
        session.flush()
        session.execute(
            text(
                "UPDATE runs SET status = 'waiting', waiting_on = 'approval:x', "
                "wake_at = now() + make_interval(days => :wake), "
                "updated_at = now() - make_interval(days => :days) WHERE id = :id"
            ),
            {"days": waiting_days, "wake": wake_in_days, "id": run_id},
        )
        session.add(Action(idempotency_key=f"nightly_report:{run_id}", run_id=run_id,
                           tool="send_report_email", service="email", args={"to": "a@b.c"},
                           approvers=[], state=ActionState.PENDING_APPROVAL,
                           requires_approval=True))  # fmt: skip
    return run_id


def test_a_run_parked_past_the_maximum_wait_with_no_deadline_expires(db_url: str) -> None:
    # given an approval nobody gave for 31 days, a timer set 90 days ahead 31 days ago, and
    # runs that are not past the maximum wait (one with a timer due sooner than it)
    ancient = parked_run(31)
    far_timer = parked_run(31, wake_in_days=59)
    recent = parked_run(29)
    near_timer = parked_run(29, wake_in_days=1)

    # when the tick runs
    report = tick()

    # then the ancient one and the far timer end, reason expired, and their approvals are
    # withdrawn: a timer further off than the maximum wait does not keep a run for ever
    assert sorted(report.expired) == sorted([ancient, far_timer])
    with transaction() as session:
        for gone in (ancient, far_timer):
            row = session.get(Run, gone)
            assert row is not None
            assert (row.status, row.stop_reason, row.wake_at) == (RunStatus.FAILED, "expired", None)
            assert "for longer than 30 days" in (row.error or "")
            action = session.scalars(select(Action).where(Action.run_id == gone)).one()
            assert action.state == ActionState.WITHDRAWN
        row = session.get(Run, far_timer)
        assert row is not None and "; its timer was set for " in (row.error or ""), row.error
        for other in (recent, near_timer):
            kept = session.get(Run, other)
            assert kept is not None and kept.status == RunStatus.WAITING
