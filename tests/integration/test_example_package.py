"""A user's agent package (examples/oncall_digest: one tool in today's schema= form, one typed)
installed as a distribution of its own, registered by its entry point, run by real workers and
started from a service that has only Celery installed: listed, started by task name and from
the command line, scheduled, and its email sent once though a worker dies between the send and
the saved reply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from models import Action, JournalEntry, Run, RunStatus
from pipeline.db import transaction
from pipeline.registry import get_agent
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import get_settings
from pipeline.testing import run_agent
from tests.integration.conftest import EXAMPLE, ProcessFactory
from tests.support import ServiceUrls, wait_for, wait_for_status

DISTRIBUTION = "oncall-digest"
TOKEN = "tok-oncall-7d1e9b"
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.NEEDS_ATTENTION.value}


def nightshift(*args: str) -> str:
    command = [str(Path(sys.executable).with_name("nightshift")), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def journal_and_action_of(run_id: uuid.UUID) -> tuple[list[tuple[str, str, Any]], Action]:
    with transaction() as session:
        entries = session.execute(
            select(JournalEntry.key, JournalEntry.step_name, JournalEntry.payload)
            .where(JournalEntry.run_id == run_id)
            .order_by(JournalEntry.id)
        ).all()
        action = session.scalars(select(Action).where(Action.run_id == run_id)).one()
        session.expunge(action)
    return [(e.key, e.step_name, e.payload) for e in entries], action


def emails_under(email: EmailSandbox, team: str, date: str) -> int:
    return len(email.deliveries(f"oncall_digest:{date}:{team}"))


@pytest.fixture
def oncall_services(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EmailSandbox]:
    """The ops web service and the mail service the example talks to, configured the way its
    README says; the scripted model (no ANTHROPIC_API_KEY); a nightly schedule naming it."""
    web = WebSandbox(log_path=tmp_path / "web.jsonl").start()
    email = EmailSandbox(log_path=tmp_path / "email.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_ONCALL_WEB_URL", web.url)
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_ONCALL_EMAIL_URL", email.url)
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_ONCALL_EMAIL_TOKEN", TOKEN)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    shipped_off = json.loads(Path(os.environ["NIGHTSHIFT_SCHEDULES_FILE"]).read_text())
    nightly = {"name": "oncall-digest-nightly", "agent": "oncall_digest", "minute": "30",
               "hour": "1", "timezone": "Europe/Berlin", "params": {"team": "nightly"}}  # fmt: skip
    schedules = tmp_path / "schedules.json"
    schedules.write_text(json.dumps([*shipped_off, nightly]))
    monkeypatch.setenv("NIGHTSHIFT_SCHEDULES_FILE", str(schedules))
    get_settings.cache_clear()
    yield email
    email.stop()
    web.stop()


def test_a_users_package_is_listed_started_by_name_scheduled_and_sends_each_email_once(
    example_installed: None,
    celery_only: Path,
    oncall_services: EmailSandbox,
    processes: ProcessFactory,
    services: ServiceUrls,
) -> None:
    email = oncall_services

    # the package's own offline tests (the script and the tools) pass where it is installed
    offline = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                             cwd=EXAMPLE, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert offline.returncode == 0, offline.stdout + offline.stderr

    # the agent is registered by its package's entry point, like the shipped ones
    listed = {a["name"]: a for a in json.loads(nightshift("agents", "--json"))}
    digest = listed["oncall_digest"]
    assert digest["package"] == f"{DISTRIBUTION} 0.1.0"
    assert digest["registered_by"] == f"entry point 'oncall_digest' of {DISTRIBUTION}"
    tools = {t["name"]: t for t in digest["tools"]}
    assert not tools["read_handover"]["typed"] and tools["read_handover"]["side_effect"] is None
    mail = tools["mail_digest"]
    assert mail["typed"] and mail["side_effect"]["service"] == "email"

    # given a worker that dies after its first email went out and before the reply was saved
    processes("beat", beat=True)
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_send_before_reply"})

    # when a service with only Celery installed starts two digests by task name
    client = subprocess.run(
        [str(celery_only), "-I", str(EXAMPLE / "start_from_another_service.py"),
         services.broker, os.environ["NIGHTSHIFT_QUEUE"],
         "ops", "2026-11-29", "payments", "2026-11-29"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert client.returncode == 0, client.stderr
    started = json.loads(client.stdout)
    assert started["nightshift_importable"] is False and started["nightshift_loaded"] == []
    ops_run, payments_run = (uuid.UUID(r) for r in started["run_ids"])
    wait_for(doomed.exited, timeout=60, what="the worker to die after the first send")

    # and a healthy worker takes over
    processes("healthy")
    for run_id in (ops_run, payments_run):
        row = wait_for_status(run_id, DONE, timeout=90)
        assert row.status == RunStatus.SUCCEEDED, row.error

    # then each digest went out exactly once
    assert emails_under(email, "ops", "2026-11-29") == 1
    assert emails_under(email, "payments", "2026-11-29") == 1

    # and pipeline.testing, with no service, decides what the workers did: the same journal
    # entries, the same arguments, the same action for the email (its key, service, arguments)
    worked, email_action = journal_and_action_of(ops_run)
    handover = json.loads(next(p["content"] for k, n, p in worked if n == "read_handover"))
    offline_run = run_agent(get_agent("oncall_digest"), {"team": "ops", "date": "2026-11-29"},
                            tools={"read_handover": handover})  # fmt: skip
    assert [(e.key, e.step_name) for e in offline_run.journal] == [(k, n) for k, n, _ in worked]
    (recorded,) = offline_run.actions
    assert (recorded.key, recorded.service, recorded.args, recorded.requires_approval) == (
        email_action.idempotency_key, email_action.service, email_action.args, False
    )  # fmt: skip

    # the command line starts it too
    out = nightshift("start", "oncall_digest", "--input", '{"team": "web", "date": "2026-11-30"}')
    cli_run = uuid.UUID(out.split()[-1])
    assert wait_for_status(cli_run, DONE, timeout=60).status == RunStatus.SUCCEEDED
    assert emails_under(email, "web", "2026-11-30") == 1

    # and the schedule naming it fires one run for its slot
    fired = json.loads(nightshift("schedules", "fire", "oncall-digest-nightly", "--json"))
    scheduled = uuid.UUID(fired["run_id"])
    row = wait_for_status(scheduled, DONE, timeout=60)
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert row.input["team"] == "nightly"
    assert emails_under(email, "nightly", row.input["date"]) == 1
    assert len(email.deliveries()) == 4

    # the email token the tool sent never reached the journal
    with transaction() as session:
        payloads = session.scalars(select(JournalEntry.payload)).all()
        agents = set(session.scalars(select(Run.agent)).all())
    assert agents == {"oncall_digest"}
    assert payloads and TOKEN not in json.dumps(payloads)
