"""Starting runs and the engine's own rules, driven through execute_step (what the step task
calls) against real PostgreSQL; the web and email sandboxes answer the tools."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from models import Artifact, JournalEntry, Run, RunStatus
from pipeline.db import transaction
from pipeline.engine.step import StepOutcome, execute_step
from pipeline.errors import IdempotencyConflict, InputTooLarge, InvalidInput, UnknownAgent
from pipeline.registry import agent_version
from pipeline.runs.start import create_run_txn
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import get_settings
from tests.support import run_row

REPORT = {"team": "ops", "date": "2026-11-29"}


@pytest.fixture
def tools_up(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    web = WebSandbox(log_path=tmp_path / "web.jsonl").start()
    email = EmailSandbox(log_path=tmp_path / "email.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_WEB_URL", web.url)
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_URL", email.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    get_settings.cache_clear()
    yield
    email.stop()
    web.stop()


def create(agent: str, run_input: object, key: str | None = None) -> uuid.UUID:
    with transaction() as session:
        return create_run_txn(session, agent, run_input, key).run_id


def run_count() -> int:
    with transaction() as session:
        return int(session.scalar(select(func.count()).select_from(Run)) or 0)


def drive(run_id: uuid.UUID, limit: int = 20) -> Run:
    for _ in range(limit):
        if execute_step(run_id, "test-worker").outcome is not StepOutcome.CONTINUE:
            break
    return run_row(run_id)


@pytest.mark.parametrize(
    ("agent", "run_input", "error", "message"),
    [
        ("nightly_reprot", REPORT, UnknownAgent, "unknown agent 'nightly_reprot'"),
        ("nightly_report", {"team": "ops"}, InvalidInput, "'date' is a required property"),
        ("nightly_report", {**REPORT, "extra": 1}, InvalidInput, "extra"),
        ("nightly_report", ["not", "an", "object"], InvalidInput, "must be a JSON object"),
        ("nightly_report", {**REPORT, "sources": ["x" * 70_000]}, InputTooLarge, "limit"),
    ],
)
def test_bad_requests_are_refused_clearly_and_create_nothing(
    db_url: str, agent: str, run_input: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        create(agent, run_input)
    assert run_count() == 0


def test_a_repeated_key_returns_the_first_run_and_a_different_request_is_refused(
    db_url: str,
) -> None:
    first = create("nightly_report", REPORT, key="ops-2026-11-29")
    assert create("nightly_report", REPORT, key="ops-2026-11-29") == first
    with pytest.raises(IdempotencyConflict, match="different agent or input"):
        create("nightly_report", {**REPORT, "team": "web"}, key="ops-2026-11-29")
    with pytest.raises(InvalidInput, match="idempotency key"):
        create("nightly_report", REPORT, key="")
    assert run_count() == 1


def test_the_run_records_what_it_was_asked_and_by_which_code(db_url: str) -> None:
    row = run_row(create("nightly_report", REPORT))
    assert row.input == REPORT
    assert row.status == RunStatus.RUNNING and row.attempt == 0
    assert row.code_version and len(row.prompt_version) == 16
    assert row.agent_version == row.running_version == agent_version("nightly_report")
    assert row.agent_version.startswith(f"{row.code_version}+")  # nightshift's own package


def test_a_resumed_step_replays_the_journal_and_writes_only_new_entries(
    tools_up: None,
) -> None:
    run_id = create("nightly_report", REPORT)
    execute_step(run_id, "test-worker")
    execute_step(run_id, "test-worker")
    with transaction() as session:
        before = session.execute(
            select(JournalEntry.id, JournalEntry.key).order_by(JournalEntry.id)
        ).all()
    row = drive(run_id)
    assert row.status == RunStatus.SUCCEEDED, row.error
    with transaction() as session:
        after = session.execute(
            select(JournalEntry.id, JournalEntry.key).order_by(JournalEntry.id)
        ).all()
    assert after[: len(before)] == before  # nothing rewritten, only appended
    assert len({key for _, key in after}) == len(after)


def test_the_success_check_sends_the_model_back_to_work(
    tools_up: None, register_agents: Callable[..., None]
) -> None:
    # a model that claims to be done before emailing the report
    register_agents("tests.fixture_agents:LAZY_REPORT")
    run_id = create("lazy_report", REPORT)
    row = drive(run_id)
    assert row.status == RunStatus.SUCCEEDED, row.error
    with transaction() as session:
        notes = session.scalars(
            select(JournalEntry.key).where(JournalEntry.key.like("note:%"))
        ).all()
    assert len(notes) == 1  # one nudge, then it finished the job


def test_large_tool_outputs_are_kept_as_artifacts(
    tools_up: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIGHTSHIFT_ARTIFACT_THRESHOLD_BYTES", "200")
    get_settings.cache_clear()
    run_id = create("nightly_report", REPORT)
    row = drive(run_id)
    assert row.status == RunStatus.SUCCEEDED, row.error
    with transaction() as session:
        artifacts = session.scalars(select(Artifact).where(Artifact.run_id == run_id)).all()
        fetched = session.scalar(
            select(JournalEntry.payload).where(
                JournalEntry.step == 0, JournalEntry.key.like("tool:%")
            )
        )
        contents = {a.id: a.content for a in artifacts}  # deferred: loaded in the session
    assert {a.name for a in artifacts} >= {"fetch_source", "report"}
    # the model sees a preview that names the artifact by id and API URL, never a server path
    assert fetched is not None and "stored as artifact" in fetched["content"]
    assert f"/runs/{run_id}/artifacts/" in fetched["content"]
    assert "/artifacts/" + str(run_id) not in fetched["content"]
    for artifact in artifacts:
        content = contents[artifact.id]
        assert content is not None and len(content) == artifact.size
        assert hashlib.sha256(content).hexdigest() == artifact.sha256
    # and nothing is written to the worker's data dir
    assert not (get_settings().data_dir / "artifacts").exists()
    # and the run's result names the report by id and URL
    report = row.result["state"]["artifacts"]["report"]
    assert report["url"] == f"/runs/{run_id}/artifacts/{report['id']}"
    assert "path" not in report


def test_engine_log_lines_name_the_run_step_agent_and_worker(
    tools_up: None, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = create("nightly_report", REPORT)
    with caplog.at_level(logging.INFO, logger="nightshift"):
        execute_step(run_id, "host:123:thread")
    engine_lines = [r.getMessage() for r in caplog.records if r.name.startswith("nightshift.")]
    assert engine_lines
    for line in engine_lines:
        assert f"run={run_id}" in line and "step=0" in line, line
        assert "agent=nightly_report" in line and "worker=host:123:thread" in line, line


def test_a_tool_that_requires_approval_never_runs_without_the_action_protocol(
    tools_up: None, register_agents: Callable[..., None]
) -> None:
    # given a tool marked requires_approval with no side effect (forced past Tool's own check)
    register_agents("tests.fixture_agents:UNGUARDED")
    run_id = create("unguarded", {})

    # when the model calls it
    row = drive(run_id)

    # then the engine refuses to call the function, and says why to the model
    assert row.status == RunStatus.SUCCEEDED, row.error
    with transaction() as session:
        [result] = session.scalars(
            select(JournalEntry.payload).where(JournalEntry.key.like("tool:%"))
        ).all()
    assert result["is_error"] is True
    assert "requires approval but declares no side effect" in result["content"]
    assert "GRANTED" not in json.dumps(result)
