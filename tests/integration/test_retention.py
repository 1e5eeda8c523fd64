"""Retention: old finished runs lose their payloads, their artifacts' contents and the fields
their agent declares personal, and keep their outcome; an open obligation keeps its action
whole; a dry run changes nothing."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from sqlalchemy import func, select, text, update

from models import Action, ActionState, Artifact, JournalEntry, Run, RunEvent, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.engine import artifacts
from pipeline.runs.retention import cleanup
from pipeline.runs.start import create_run_txn
from pipeline.settings import get_settings

REPORT = {"team": "ops", "date": "2026-11-29", "email_to": "priya@example.com"}
EMAIL = {"subject": "Nightly report for ops", "body": "Primary on call: Priya Raman."}
SENT = {"message_id": "em_1", "to": "priya@example.com", "subject": "Nightly report for ops"}
RESULT = {"text": "The nightly report for ops is written and sent.", "state": {"artifacts": {}}}
MODEL_REPLY = {
    "content": [
        {"type": "text", "text": "Reading incidents."},
        {"type": "tool_use", "id": "toolu_1", "name": "fetch_source", "input": {"name": "x"}},
    ],
    "usage": {"input_tokens": 1200, "output_tokens": 80},
}
TOOL_RESULT = {"tool_use_id": "toolu_1", "name": "fetch_source", "content": "x" * 5000,
               "is_error": False}  # fmt: skip


def finished_run(
    status: RunStatus,
    days_ago: float,
    action_state: ActionState | None = None,
    agent: str = "nightly_report",
) -> tuple[uuid.UUID, int]:
    """A finished run with a journal, an artifact and (optionally) one action."""
    with transaction() as session:
        run_id = create_run_txn(session, agent, REPORT).run_id
        session.execute(
            text(
                "UPDATE runs SET status = :status, finished_at = now() - make_interval("
                "days => :days), result = :result, stop_reason = 'completed', step = 2, "
                "input_tokens = 1200, output_tokens = 80, cost_usd = 0.0042 WHERE id = :id"
            ),
            {"status": status.value, "days": days_ago, "id": run_id,
             "result": json.dumps(RESULT)},
        )  # fmt: skip
        for key, payload in (("model:0", MODEL_REPLY), ("tool:toolu_1", TOOL_RESULT)):
            name = "ask_model" if key.startswith("model") else "fetch_source"
            session.add(JournalEntry(run_id=run_id, key=key, step=0, step_name=name,
                                     payload=payload))  # fmt: skip
        report = artifacts.prepare(run_id, "report", "# r\n" * 500, "text/markdown", 10**6)
        artifacts.store_txn(session, report)
        if action_state is not None:
            session.add(
                Action(
                    idempotency_key=f"nightly_report:{run_id}",
                    run_id=run_id,
                    tool="send_report_email",
                    service="email",
                    args=EMAIL,
                    result=SENT if action_state is ActionState.CONFIRMED else None,
                    state=action_state,
                    decision="approve" if action_state is ActionState.CONFIRMED else None,
                    decided_by="alice@example.com",
                    attempts=1,
                    approvers=[],
                )
            )
    return run_id, report.ref["id"]


def journal(run_id: uuid.UUID) -> list[tuple[dict[str, Any], bool]]:
    with transaction() as session:
        return [
            (entry.payload, entry.compacted)
            for entry in session.scalars(
                select(JournalEntry).where(JournalEntry.run_id == run_id).order_by(JournalEntry.id)
            )
        ]


def artifact_kept(artifact_id: int) -> bool:
    """True: its content is there; False: retention deleted it (and the row says when)."""
    with transaction() as session:
        content, deleted_at = session.execute(
            select(Artifact.content, Artifact.deleted_at).where(Artifact.id == artifact_id)
        ).one()
    assert (content is None) == (deleted_at is not None), "content goes with deleted_at"
    return content is not None


@pytest.fixture
def night(db_url: str) -> dict[str, tuple[uuid.UUID, int]]:
    """Old finished runs, old runs with open obligations, recent and unfinished runs."""
    runs = {
        "old succeeded": finished_run(RunStatus.SUCCEEDED, 45, ActionState.CONFIRMED),
        "old failed": finished_run(RunStatus.FAILED, 31),
        "old cancelled, approval pending": finished_run(
            RunStatus.CANCELLED, 60, ActionState.PENDING_APPROVAL
        ),
        "old failed, outcome unknown": finished_run(
            RunStatus.FAILED, 60, ActionState.OUTCOME_UNKNOWN
        ),
        "recent succeeded": finished_run(RunStatus.SUCCEEDED, 2),
        "old but still waiting": finished_run(RunStatus.SUCCEEDED, 90),
    }
    with transaction() as session:
        session.execute(
            update(Run)
            .where(Run.id == runs["old but still waiting"][0])
            .values(status=RunStatus.WAITING, finished_at=None)
        )
        session.execute(
            text("UPDATE runs SET updated_at = now() - interval '90 days' WHERE id = :id"),
            {"id": runs["old but still waiting"][0]},
        )
    return runs


COMPACTED = {
    "old succeeded",
    "old failed",
    "old cancelled, approval pending",
    "old failed, outcome unknown",
}
OBLIGED = {"old cancelled, approval pending", "old failed, outcome unknown"}


def feed_events(run_id: uuid.UUID) -> int:
    with transaction() as session:
        found = session.scalar(select(func.count()).where(RunEvent.run_id == run_id))
    return int(found or 0)


def test_a_dry_run_says_what_would_go_and_changes_nothing(
    night: dict[str, tuple[uuid.UUID, int]], capsys: pytest.CaptureFixture[str]
) -> None:
    report = cleanup(dry_run=True)
    names = {run_id: name for name, (run_id, _) in night.items()}
    assert {names[c.run_id] for c in report.compacted} == COMPACTED
    assert {names[k.run_id] for k in report.kept} == OBLIGED
    [succeeded] = [c for c in report.compacted if c.run_id == night["old succeeded"][0]]
    assert succeeded.journal_entries == 2 and succeeded.journal_bytes > 5000
    assert succeeded.artifacts == 1 and succeeded.artifact_bytes == 2000
    for run_id, artifact_id in night.values():
        assert artifact_kept(artifact_id)
        assert not any(compacted for _, compacted in journal(run_id))

    # and the command prints the same
    assert main(["cleanup", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would compact 4 run(s)" in out and "would delete 0 compact record(s)" in out
    assert "1 action(s) pending_approval" in out and "1 action(s) outcome_unknown" in out


def test_cleanup_compacts_old_finished_runs_and_keeps_open_obligations_whole(
    night: dict[str, tuple[uuid.UUID, int]],
) -> None:
    # when the daily cleanup runs with the default age (30 days)
    report = cleanup()
    assert len(report.compacted) == 4 and not report.dry_run

    for name, (run_id, artifact_id) in night.items():
        entries = journal(run_id)
        if name in COMPACTED:
            # then old finished runs keep an outline per entry, none of its text, and lose
            # their artifacts' contents
            assert [compacted for _, compacted in entries] == [True, True]
            model, tool = (payload for payload, _ in entries)
            assert model == {
                "compacted": True,
                "outline": True,
                "summary": "model [1200/80 tok]; asks fetch_source",
            }
            assert tool == {"compacted": True, "outline": True, "summary": "fetch_source -> ok"}
            assert not artifact_kept(artifact_id)
            assert feed_events(run_id) == 0  # the live feed served its purpose
        else:
            # and every other run is untouched
            assert entries == [(MODEL_REPLY, False), (TOOL_RESULT, False)], name
            assert artifact_kept(artifact_id), name
            assert feed_events(run_id) > 0, name

    # and the compact record keeps the outcome: status, reason, result, usage, cost and the
    # key decisions, with only what nightly_report declares personal dropped (the input's
    # email_to, the email's body and address)
    with transaction() as session:
        run = session.get(Run, night["old succeeded"][0])
        assert run is not None
        assert (run.status, run.result, run.stop_reason) == (
            RunStatus.SUCCEEDED,
            RESULT,
            "completed",
        )
        assert run.input == {**REPORT, "email_to": "[redacted]"}
        assert run.compacted_at is not None
        assert (run.step, run.input_tokens, run.output_tokens) == (2, 1200, 80)
        assert run.cost_usd == pytest.approx(0.0042)
        kept = session.scalars(select(Action).where(Action.run_id == run.id)).one()
        assert (kept.state, kept.decision, kept.decided_by) == (
            ActionState.CONFIRMED,
            "approve",
            "alice@example.com",
        )
        assert kept.args == {**EMAIL, "body": "[redacted]"}
        assert kept.result == {**SENT, "to": "[redacted]"}
        assert kept.compacted_at is not None
        # but an open obligation keeps what a lookup, a resend or an approver needs
        for name in OBLIGED:
            owed = session.scalars(select(Action).where(Action.run_id == night[name][0])).one()
            assert owed.args == EMAIL and owed.compacted_at is None, name

    # and a second cleanup finds nothing left to do
    assert cleanup().compacted == []


def test_a_run_of_an_agent_not_registered_here_loses_its_data_whole(db_url: str) -> None:
    # given an old run of an agent this process does not know (retired since), whose
    # declaration nobody can read any more
    run_id, _ = finished_run(RunStatus.SUCCEEDED, 45, ActionState.CONFIRMED)
    with transaction() as session:
        session.execute(update(Run).where(Run.id == run_id).values(agent="retired_report"))

    # when retention compacts it
    assert [c.run_id for c in cleanup().compacted] == [run_id]

    # then its input, result, arguments and results go whole: nobody says what is personal
    with transaction() as session:
        run = session.get(Run, run_id)
        assert run is not None and run.input == run.result == {"redacted": True}
        action = session.scalars(select(Action).where(Action.run_id == run_id)).one()
        assert action.args == action.result == {"redacted": True}
        assert (action.state, action.decided_by) == (ActionState.CONFIRMED, "alice@example.com")


def test_the_age_comes_from_the_environment_or_the_command(
    night: dict[str, tuple[uuid.UUID, int]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("NIGHTSHIFT_RETENTION_DAYS", "61")
    get_settings.cache_clear()
    assert get_settings().retention_days == 61
    assert cleanup(dry_run=True).compacted == []  # the only 61-day-old run is waiting
    assert main(["retention", "--older-than", "1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert len(printed["compacted"]) == 5 and printed["dry_run"] is False
    assert main(["retention", "--older-than", "0"]) == 2
    assert "--older-than must be at least 1 day" in capsys.readouterr().err
    assert main(["retention", "--delete-after", "0.5"]) == 2
    assert "--delete-after must be at least 1 day" in capsys.readouterr().err
    monkeypatch.setenv("NIGHTSHIFT_RETENTION_DAYS", "soon")
    get_settings.cache_clear()
    assert main(["cleanup"]) == 2
    assert "NIGHTSHIFT_RETENTION_DAYS must be a number" in capsys.readouterr().err
    monkeypatch.setenv("NIGHTSHIFT_RETENTION_DAYS", "30")
    monkeypatch.setenv("NIGHTSHIFT_RETENTION_DELETE_DAYS", "0")
    get_settings.cache_clear()
    assert main(["retention", "--dry-run"]) == 2
    assert "NIGHTSHIFT_RETENTION_DELETE_DAYS must be at least 1" in capsys.readouterr().err
