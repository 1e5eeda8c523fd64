"""What a tool needs is said up front: `nightshift agents` lists it, and a worker that lacks a
setting warns at start, before any run of that agent fails on it."""

from __future__ import annotations

import json

import pytest

from pipeline.cli.main import main
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for


def test_agents_lists_each_tools_needs_and_which_are_unset(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NIGHTSHIFT_EMAIL_URL", raising=False)
    monkeypatch.setenv("NIGHTSHIFT_WEB_URL", "http://web.example")
    get_settings.cache_clear()
    assert main(["agents", "--json"]) == 0
    agents = {a["name"]: a for a in json.loads(capsys.readouterr().out)}
    tools = {t["name"]: t for t in agents["nightly_report"]["tools"]}
    assert tools["send_report_email"]["needs"] == ["NIGHTSHIFT_EMAIL_URL"]
    assert tools["send_report_email"]["needs_unset"] == ["NIGHTSHIFT_EMAIL_URL"]
    assert tools["fetch_source"]["needs_unset"] == []
    assert main(["agents"]) == 0
    assert "needs NIGHTSHIFT_EMAIL_URL (not set here)" in capsys.readouterr().out


def test_a_worker_warns_at_start_of_a_need_it_lacks(
    db_url: str, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NIGHTSHIFT_EMAIL_URL", raising=False)
    monkeypatch.setenv("NIGHTSHIFT_WEB_URL", "http://web.example")
    worker = processes("w1")
    line = wait_for(
        lambda: next((x for x in worker.log().splitlines() if "agent nightly_report:" in x), None),
        timeout=30,
        what="the worker's warning",
    )
    assert "WARNING" in line
    assert "NIGHTSHIFT_EMAIL_URL (send_report_email) not set on this worker" in line
    assert "NIGHTSHIFT_WEB_URL" not in line
