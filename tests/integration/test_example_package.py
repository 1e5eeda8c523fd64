"""A user's agent package (examples/oncall_digest: one tool in today's schema= form, one typed)
installed as a distribution of its own, registered by its entry point, run by real workers and
started from a service that has only Celery installed: listed, started by task name and from
the command line, scheduled, and its email sent once though a worker dies between the send and
the saved reply."""

from __future__ import annotations

import importlib
import json
import os
import site
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from sqlalchemy import select

from models import JournalEntry, Run, RunStatus
from pipeline.db import transaction
from pipeline.registry import registry
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import ServiceUrls, wait_for, wait_for_status

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "oncall_digest"
DISTRIBUTION = "oncall-digest"
TOKEN = "tok-oncall-7d1e9b"
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.NEEDS_ATTENTION.value}


def pip(python: Path | str, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "-q", *args], check=True, timeout=300)


@pytest.fixture(scope="session")
def example_installed() -> Iterator[None]:
    """`pip install -e examples/oncall_digest` into the venv running the tests, as a user
    would; removed again at the end unless it was there before."""
    try:
        distribution(DISTRIBUTION)
        there_before = True
    except PackageNotFoundError:
        there_before = False
        pip(sys.executable, "install", "-e", str(EXAMPLE))
    # This process started before the install: read its .pth so the registry can import it.
    site.addsitedir(sysconfig.get_paths()["purelib"])
    importlib.invalidate_caches()
    registry.cache_clear()
    yield
    if not there_before:
        pip(sys.executable, "uninstall", "-y", DISTRIBUTION)
    registry.cache_clear()


@pytest.fixture(scope="session")
def celery_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh venv with only celery[redis] installed: another team's service."""
    venv = tmp_path_factory.mktemp("celery-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    pip(python, "install", "celery[redis]>=5.7,<6")
    return python


def nightshift(*args: str) -> str:
    command = [str(Path(sys.executable).with_name("nightshift")), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


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
