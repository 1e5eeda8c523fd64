"""What a tool needs is said up front: `nightshift agents` lists it, and a worker that lacks a
setting warns at start, before any run of that agent fails on it."""

from __future__ import annotations

import json
import os

import pytest

from pipeline.cli.main import main
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for

REPORT = {"team": "ops", "date": "2026-11-29"}


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


def test_start_says_where_a_missing_setting_comes_from(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a team's agent whose tool needs its own service's URL, which is not set here
    from pipeline.registry import registry

    agents = f"{os.environ['NIGHTSHIFT_AGENTS']},tests.fixture_agents:ACME_TRIAGE"
    monkeypatch.setenv("NIGHTSHIFT_AGENTS", agents)
    monkeypatch.delenv("NIGHTSHIFT_CONFIG_ACME_URL", raising=False)
    monkeypatch.delenv("NIGHTSHIFT_EMAIL_URL", raising=False)
    get_settings.cache_clear()
    registry.cache_clear()
    try:
        # when a run of it is started here
        assert main(["start", "acme_triage", "--input", '{"word": "hi"}']) == 0
        team = capsys.readouterr().err
        # and one of the shipped report, whose email service the sandbox provides
        assert main(["start", "nightly_report", "--input", json.dumps(REPORT)]) == 0
        shipped = capsys.readouterr().err
    finally:
        registry.cache_clear()
        get_settings.cache_clear()
    # then the note says where each comes from: the sandbox only for what it can provide
    assert "NIGHTSHIFT_CONFIG_ACME_URL: set it in every worker's environment" in team
    assert "NIGHTSHIFT_CONFIG_FILE" in team and "sandbox" not in team
    sandbox = 'for a trial, eval "$(nightshift sandbox up)" sets it'
    assert f"NIGHTSHIFT_EMAIL_URL: set it in every worker's environment; {sandbox}" in shipped
