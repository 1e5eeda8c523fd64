"""A failed action does not poison its key for ever (finding 7), with real workers: a failure is
replayed to every run that means the action (and logged as replayed) until a person retries
it; then the next run does it, once, and the audit trail says who retried."""

from __future__ import annotations

import getpass
import json

import pytest
from sqlalchemy import select

from models import ActionState, JournalEntry, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.runs.start import start_run
from tests.integration.api_fixtures import action_row, audit_trail
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import wait_for_status

REPORT = {"team": "ops", "date": "2026-11-29"}
KEY = "nightly_report:2026-11-29:ops"
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}


def email_results(run_id: object) -> list[dict]:
    with transaction() as session:
        return list(
            session.scalars(
                select(JournalEntry.payload).where(
                    JournalEntry.run_id == run_id, JournalEntry.step_name == "send_report_email"
                )
            )
        )


def test_a_failure_is_replayed_until_retried_and_then_happens_once(
    sandbox: Sandbox, processes: ProcessFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a worker whose email URL points at the wrong service, which answers 404
    misconfigured = processes("misconfigured", env={"NIGHTSHIFT_EMAIL_URL": sandbox.web.url})
    first = start_run("nightly_report", REPORT).run_id
    wait_for_status(first, DONE, timeout=60)
    failed = action_row(KEY)
    assert failed.state == ActionState.FAILED and "404" in (failed.error or "")
    misconfigured.stop()

    # when the URL is fixed, the next run for the same team and night replays the failure:
    # the stored failure is the key's answer until someone says otherwise
    fixed = processes("fixed")
    second = start_run("nightly_report", REPORT).run_id
    wait_for_status(second, DONE, timeout=60)
    replayed = email_results(second)[0]
    assert replayed["is_error"] and "replayed, not tried again" in replayed["content"]
    assert f"nightshift actions retry {KEY}" in replayed["content"]
    assert "replaying its stored failure" in fixed.log()
    assert sandbox.email.deliveries(KEY) == []

    # when an operator retries it
    assert main(["actions", "retry", KEY, "--note", "NIGHTSHIFT_EMAIL_URL fixed"]) == 0
    assert "no longer replayed" in capsys.readouterr().out
    assert action_row(KEY).state == ActionState.RELEASED
    entry = audit_trail(KEY)[-1]
    assert (entry.event, entry.by, entry.via, entry.note) == (
        "retry",
        getpass.getuser(),
        "cli (OS user)",
        "NIGHTSHIFT_EMAIL_URL fixed",
    )

    # then the next run takes the key over and sends the email, once
    third = start_run("nightly_report", REPORT).run_id
    assert wait_for_status(third, DONE, timeout=60).status == RunStatus.SUCCEEDED
    assert len(sandbox.email.deliveries(KEY)) == 1
    done = action_row(KEY)
    assert (done.state, done.run_id, done.attempts) == (ActionState.CONFIRMED, third, 1)
    assert json.loads(email_results(third)[0]["content"])["to"] == "ops@example.com"

    # and only a failure can be retried
    assert main(["actions", "retry", KEY]) == 2
    assert "is confirmed; only a failed action can be retried" in capsys.readouterr().err
