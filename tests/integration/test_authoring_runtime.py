"""A user's agent through the runtime: script-less agents refused without a model, typed tools
enforced as tool errors, secrets kept out of the journal, and once() across a worker crash."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select

from models import JournalEntry, Run, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.engine.step import StepOutcome, execute_step
from pipeline.errors import NoModel
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from tests.integration.api_fixtures import AUTH, client
from tests.integration.conftest import ProcessFactory
from tests.support import run_row, wait_for, wait_for_status

NO_KEY = (
    "agent 'claude_only' has no script, so it runs only on the real model: set ANTHROPIC_API_KEY"
)


@pytest.fixture
def no_model(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    get_settings.cache_clear()


def run_count() -> int:
    with transaction() as session:
        return int(session.scalar(select(func.count()).select_from(Run)) or 0)


def tool_results(run_id: uuid.UUID) -> list[dict[str, object]]:
    with transaction() as session:
        return list(
            session.scalars(
                select(JournalEntry.payload)
                .where(JournalEntry.run_id == run_id, JournalEntry.key.like("tool:%"))
                .order_by(JournalEntry.id)
            )
        )


def drive(run_id: uuid.UUID, limit: int = 10) -> Run:
    for _ in range(limit):
        if execute_step(run_id, "test-worker").outcome is not StepOutcome.CONTINUE:
            break
    return run_row(run_id)


def test_an_agent_without_a_script_is_refused_at_start_when_no_model_is_configured(
    no_model: None,
    register_agents: Callable[..., None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    register_agents("tests.fixture_agents:CLAUDE_ONLY")

    # when it is started with no ANTHROPIC_API_KEY, from code, the command line or the API
    with pytest.raises(NoModel) as refused:
        start_run("claude_only", {})
    assert main(["start", "claude_only", "--input", "{}"]) == 2
    with client() as api:
        answer = api.post("/runs", json={"agent": "claude_only", "input": {}}, headers=AUTH)

    # then it is refused in one line naming the agent and the variable, and nothing is created
    assert str(refused.value) == NO_KEY
    assert capsys.readouterr().err == f"nightshift: {NO_KEY}\n"
    assert (answer.status_code, answer.json()) == (503, {"error": NO_KEY})
    assert run_count() == 0

    # and with a key it starts
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-not-secret")
    get_settings.cache_clear()
    assert start_run("claude_only", {}).created


def test_a_wrong_argument_to_a_typed_tool_goes_back_to_the_model_and_the_run_continues(
    no_model: None, register_agents: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_ACME_TOKEN", "tok-live-8f3a2c")
    get_settings.cache_clear()
    register_agents("tests.fixture_agents:TYPED_REMINDERS")
    run_id = start_run("typed_reminders", {}).run_id

    row = drive(run_id)

    assert row.status == RunStatus.SUCCEEDED, row.error
    wrong, right, refused = tool_results(run_id)
    assert wrong["is_error"] is True
    assert wrong["content"] == (
        "invalid arguments: client: String should match pattern '^[a-z]+$'; days_overdue: "
        "Input should be a valid integer, unable to parse string as an integer"
    )
    assert right["is_error"] is False and right["content"] == '{"client": "acme", "days": 3}'
    # a secret setting the tool's error repeated is not in the journal
    assert refused["is_error"] is True
    assert refused["content"] == "call_acme failed: 401 for token [redacted]"
    assert row.result is not None and "acme" in row.result["text"]


def test_once_does_not_run_again_when_the_worker_dies_after_it_committed(
    no_model: None,
    register_agents: Callable[..., None],
    processes: ProcessFactory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # given a tool that allocates an invoice number with once(), and a worker that dies right
    # after once() committed and before the step's checkpoint
    numbers = tmp_path / "numbers.log"
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_NUMBERS_LOG", str(numbers))
    register_agents("tests.fixture_agents:NUMBERED_INVOICES")
    processes("beat", beat=True)
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_once_committed"})
    run_id = start_run("numbered_invoices", {}).run_id
    wait_for(doomed.exited, timeout=60, what="the worker to die after once() committed")
    assert numbers.read_text() == "allocated\n"
    assert tool_results(run_id) == []  # the tool call itself was not journaled

    # when a healthy worker replays the step
    processes("healthy")
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value})

    # then the tool ran again but once() returned the stored number without allocating another
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert numbers.read_text() == "allocated\n"
    (result,) = tool_results(run_id)
    assert result["content"] == '{"client": "acme", "number": 1001}'
    assert row.attempt >= 2  # the step was claimed twice


def test_once_runs_again_when_the_worker_dies_before_its_result_was_journaled(
    no_model: None,
    register_agents: Callable[..., None],
    processes: ProcessFactory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # given a worker that dies after the tool's once() allocated a number and before the
    # result's journal write committed
    numbers = tmp_path / "numbers.log"
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_NUMBERS_LOG", str(numbers))
    register_agents("tests.fixture_agents:NUMBERED_INVOICES")
    processes("beat", beat=True)
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_once_ran"})
    run_id = start_run("numbered_invoices", {}).run_id
    wait_for(doomed.exited, timeout=60, what="the worker to die between fn() and the commit")
    assert numbers.read_text() == "allocated\n"
    with transaction() as session:
        kept = session.scalars(select(JournalEntry.key).where(JournalEntry.run_id == run_id)).all()
    assert not [key for key in kept if key.startswith("once:")], "nothing was journaled"

    # when a healthy worker replays the step
    processes("healthy")
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value})

    # then fn ran again, as once() documents (the first number is skipped), and the run saw
    # one number: the one journaled
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert numbers.read_text() == "allocated\nallocated\n"
    (result,) = tool_results(run_id)
    assert result["content"] == '{"client": "acme", "number": 1002}'
    assert "1001" not in row.result["text"] and "1002" in row.result["text"]
