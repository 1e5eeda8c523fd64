"""A step that fails on a database error is recorded as what it was, on a real worker: the run
is handed to the next attempt at once and its failure says `database_error` and the error,
never that its worker was lost; a statement that always fails stops the run with that reason
after the agent's max_step_attempts, and the worker goes on.

The error is PostgreSQL's own: a trigger refuses the run's journal entries a given number of
times (a sequence counts them: it is not rolled back with the failed statement).
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from models import RunStatus
from pipeline.db import transaction
from pipeline.runs.start import start_run
from tests.integration.conftest import ProcessFactory
from tests.support import nightshift, run_row, wait_for_status

REFUSAL = "the test refuses this journal entry"
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}


def refuse_journal_entries(times: int) -> None:
    """The next `times` journal entries (of any run) fail in PostgreSQL."""
    with transaction() as session:
        session.execute(text("CREATE SEQUENCE refused_entries"))
        session.execute(
            text(
                f"""
                CREATE FUNCTION refuse_entry() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF nextval('refused_entries') <= {times} THEN
                    RAISE EXCEPTION '{REFUSAL}';
                  END IF;
                  RETURN NEW;
                END $$
                """
            )
        )
        session.execute(
            text(
                "CREATE TRIGGER refuse_entry BEFORE INSERT ON journal "
                "FOR EACH ROW EXECUTE FUNCTION refuse_entry()"
            )
        )


@pytest.fixture
def scripted(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)


@pytest.mark.timeout(120)
def test_a_step_that_failed_on_a_database_error_is_retried_and_named(
    scripted: None, processes: ProcessFactory
) -> None:
    # given a worker, and PostgreSQL refusing the first journal entry it is sent
    worker = processes("w1")
    refuse_journal_entries(1)

    # when a run starts, its first step fails on that error
    run_id = start_run("bench", {"steps": 3}).run_id
    row = wait_for_status(run_id, DONE, timeout=60)

    # then the next attempt carried the run to its end, and the failure says what it was
    assert row.status == RunStatus.SUCCEEDED, row.error
    (failure,) = row.failures
    assert failure["kind"] == "database_error"
    assert failure["counted"] is True
    assert failure["error"] == f"RaiseException: {REFUSAL}"
    assert "failed on a database error (RaiseException" in worker.log()
    assert not worker.exited()


@pytest.mark.timeout(120)
def test_a_statement_that_always_fails_stops_the_run_with_its_error_not_a_lost_worker(
    scripted: None, processes: ProcessFactory
) -> None:
    # given a worker, and PostgreSQL refusing every journal entry
    worker = processes("w1")
    refuse_journal_entries(1000)

    # when a run starts
    run_id = start_run("bench", {"steps": 3}).run_id
    row = wait_for_status(run_id, DONE, timeout=60)

    # then it failed after its three attempts, with the database's reason, and no attempt was
    # taken for a lost worker (none lapsed: each was handed on at once)
    assert (row.status, row.stop_reason) == (RunStatus.FAILED, "database_error")
    assert f"it failed on a database error (RaiseException: {REFUSAL})" in row.error
    assert "worker was lost" not in row.error and "lease lapsed" not in row.error
    assert [f["kind"] for f in run_row(run_id).failures] == ["database_error"] * 3
    shown = nightshift("show", str(run_id))
    assert "database_error" in shown.stdout, shown.stdout

    # and the worker goes on: the next run (once PostgreSQL accepts) succeeds on it
    with transaction() as session:
        session.execute(text("DROP TRIGGER refuse_entry ON journal"))
    after = start_run("bench", {"steps": 2}).run_id
    assert wait_for_status(after, DONE, timeout=60).status == RunStatus.SUCCEEDED
    assert not worker.exited()
