"""The `nightshift` command for people: clear errors, tables, --json, watch."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import update

from models import Action, ActionState, Run, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.runs.start import create_run_txn

REPORT = {"team": "ops", "date": "2026-11-29"}


def finished_run() -> uuid.UUID:
    with transaction() as session:
        run_id = create_run_txn(session, "nightly_report", REPORT).run_id
        session.execute(
            update(Run).where(Run.id == run_id).values(status=RunStatus.SUCCEEDED, step=6)
        )
    return run_id


def test_bad_input_is_one_clear_line_and_exit_code_2(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["start", "nightly_report", "--input", "{team: ops}"]) == 2
    assert "--input is not valid JSON" in capsys.readouterr().err
    assert main(["start", "nightly_reprot", "--input", json.dumps(REPORT)]) == 2
    assert "unknown agent 'nightly_reprot'" in capsys.readouterr().err
    assert main(["show", "not-a-run"]) == 2
    assert "is not a run id" in capsys.readouterr().err
    assert main(["watch", "nothing-by-this-name"]) == 2
    assert "neither a run id nor a batch id" in capsys.readouterr().err


def test_runs_show_and_watch_a_finished_run(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = finished_run()
    assert main(["runs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed] == [str(run_id)]
    assert main(["show", str(run_id)]) == 0
    assert f"run {run_id}  agent nightly_report  status succeeded" in capsys.readouterr().out
    assert main(["watch", str(run_id), "--interval", "0.1"]) == 0
    assert "nightly_report succeeded" in capsys.readouterr().out


def test_show_says_an_action_state_as_the_status_page_does_then_the_state(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a finished run whose email went out and was confirmed
    run_id = finished_run()
    key = f"nightly_report:{run_id}"
    with transaction() as session:
        session.add(
            Action(idempotency_key=key, run_id=run_id, tool="send_email", service="email",
                   args={}, state=ActionState.CONFIRMED, attempts=1, approvers=[])
        )  # fmt: skip
    # when a person shows the run
    assert main(["show", str(run_id)]) == 0
    # then its action reads "done" as on the status page, with the state beside it
    actions = capsys.readouterr().out.split("\nactions:\n")[1].splitlines()
    assert actions[0].split() == [key, "done", "[confirmed]", "attempts", "1"]


def test_a_short_run_id_prefix_works_everywhere_and_a_bad_one_says_why(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a run, known by the 8 characters the status page shows
    run_id = finished_run()
    short = str(run_id)[:8]
    assert main(["show", short]) == 0
    assert f"run {run_id}" in capsys.readouterr().out
    assert main(["watch", short, "--interval", "0.1"]) == 0
    assert "nightly_report succeeded" in capsys.readouterr().out
    assert main(["cancel", short]) == 0
    assert f"run {run_id} is succeeded" in capsys.readouterr().out

    # when a second run's id starts with the same characters
    twin = uuid.UUID(short + "-0000-4000-8000-000000000000")
    with transaction() as session:
        other = create_run_txn(session, "nightly_report", {**REPORT, "team": "dev"}).run_id
        session.execute(update(Run).where(Run.id == other).values(id=twin))

    # then the prefix is refused in one line naming both, and a longer one works again
    for command in (["show", short], ["watch", short], ["cancel", short]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert "several run ids" in err or "neither a run id nor a batch id" in err
    assert main(["show", str(run_id)[:13]]) == 0
    assert main(["show", "0123abcd"]) == 2
    assert "no run id starts with '0123abcd'" in capsys.readouterr().err
