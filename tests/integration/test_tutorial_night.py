"""docs/agents.md's night on a real worker (issue 33): the tutorial's night module as written,
registered beside the example package it extends (examples/oncall_digest), its schedule fired:
one batch keyed by the slot, a digest per team sent once each, then one summary naming every
team."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from models import Run, RunStatus
from pipeline.db import transaction
from pipeline.registry import registry
from pipeline.runs.schedules import fire
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import get_settings
from pipeline.slots import Schedule
from pipeline.views.batches import show_batch
from tests.integration.conftest import ProcessFactory
from tests.integration.test_tutorial import tutorial_blocks
from tests.support import wait_for

TEAMS = ["ops", "search"]
NIGHT = {"name": "oncall-night", "agent": "oncall_summary", "minute": "*",
         "params": {"teams": TEAMS}, "missed": "skip", "overlap": "allow"}  # fmt: skip


@pytest.fixture
def tutorial_night(
    example_installed: None, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EmailSandbox]:
    """The night module, registered here and on the workers this test starts, and the web and
    mail services the digests use."""
    (tmp_path / "tutorial_night.py").write_text(tutorial_blocks()["oncall_digest/night.py"])
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ['PYTHONPATH']}")
    monkeypatch.setenv(
        "NIGHTSHIFT_AGENTS", f"{os.environ['NIGHTSHIFT_AGENTS']},tutorial_night:SUMMARY"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    web = WebSandbox(log_path=tmp_path / "web.jsonl").start()
    email = EmailSandbox(log_path=tmp_path / "email.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_ONCALL_WEB_URL", web.url)
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_ONCALL_EMAIL_URL", email.url)
    monkeypatch.setenv("NIGHTSHIFT_CONFIG_ONCALL_EMAIL_TOKEN", "tok-night-2f8c1a")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    get_settings.cache_clear()
    registry.cache_clear()
    yield email
    registry.cache_clear()
    get_settings.cache_clear()
    email.stop()
    web.stop()
    sys.modules.pop("tutorial_night", None)


def test_the_tutorials_night_runs_on_a_worker(
    tutorial_night: EmailSandbox, processes: ProcessFactory
) -> None:
    email = tutorial_night
    # given a worker with the example package and the tutorial's night registered
    processes("w1")
    # when the night's schedule fires a slot, twice (a second beat, a person)
    schedule = Schedule.from_json(NIGHT)
    first = fire(NIGHT["name"], now=datetime.now(UTC), schedules=[schedule])
    again = fire(NIGHT["name"], now=datetime.now(UTC), schedules=[schedule], slot=first.slot)
    assert first.batch_id is not None and again.duplicate
    # then one batch, keyed by the slot, ends with every child and the summary succeeded
    done = wait_for(
        lambda: (b := show_batch(first.batch_id)).synthesis_status == RunStatus.SUCCEEDED and b,
        timeout=120,
        what="the night's summary",
    )
    assert first.batch_id.startswith("oncall-night:")
    assert (done.children.done, done.children.total) == (len(TEAMS), len(TEAMS))
    with transaction() as session:
        summary = session.scalar(select(Run).where(Run.id == done.synthesis_run_id))
        children = session.scalars(select(Run).where(Run.batch_id == first.batch_id)).all()
    assert summary is not None and summary.agent == "oncall_summary"
    text = summary.result["text"]
    assert all(f"{team}: succeeded (completed)" in text for team in TEAMS), text
    # and each team's digest went out exactly once
    date = {child.input["team"]: child.input["date"] for child in children if child.input}
    for team in TEAMS:
        assert len(email.deliveries(f"oncall_digest:{date[team]}:{team}")) == 1, team
