"""Fail fast, say why: a run whose tools need a service the workers are not configured for
fails at once with reason `config`, records nothing about its side effects, and the same run
succeeds once the variable is set."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from models import Action, JournalEntry, RunStatus
from pipeline.agent_definition import Conversation, tool_use
from pipeline.agents.nightly_report import script
from pipeline.db import transaction
from pipeline.runs.start import start_run
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import get_settings
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for_status

REPORT = {"team": "ops", "date": "2026-11-29"}


def count(model: type[object]) -> int:
    with transaction() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def test_an_unconfigured_service_fails_the_run_at_once_and_poisons_nothing(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, processes: ProcessFactory
) -> None:
    # given a worker started without the web and email services' URLs
    for variable in ("NIGHTSHIFT_WEB_URL", "NIGHTSHIFT_EMAIL_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    get_settings.cache_clear()
    worker = processes("worker")

    # when the nightly report is started
    failed = wait_for_status(start_run("nightly_report", REPORT).run_id, {"failed"}, 30)

    # then it fails on its first step, before any model call, naming both variables
    assert (failed.stop_reason, failed.step) == ("config", 0)
    assert "NIGHTSHIFT_WEB_URL and NIGHTSHIFT_EMAIL_URL are not set" in (failed.error or "")
    assert count(JournalEntry) == 0 and count(Action) == 0
    worker.stop()

    # and once the services are configured, the same team and date succeed with one email
    web = WebSandbox(log_path=tmp_path / "web.jsonl").start()
    email = EmailSandbox(log_path=tmp_path / "email.jsonl").start()
    try:
        monkeypatch.setenv("NIGHTSHIFT_WEB_URL", web.url)
        monkeypatch.setenv("NIGHTSHIFT_EMAIL_URL", email.url)
        processes("worker-configured")
        run_id = start_run("nightly_report", REPORT).run_id
        succeeded = wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, 60)
        assert succeeded.result["text"] == "The nightly report for ops is written and sent."
        assert len(email.deliveries()) == 1
    finally:
        email.stop()
        web.stop()


def _conversation(email_result: dict[str, object]) -> Conversation:
    """The report's conversation up to the email's result."""
    sources = ["incidents"]
    uses = [
        tool_use(0, 0, "fetch_source", {"name": "incidents"}),
        tool_use(1, 0, "write_report", {"title": "t", "body": "b"}),
        tool_use(2, 0, "send_report_email", {"subject": "t", "body": "b"}),
    ]
    results = [
        {"content": '{"title": "Incidents", "body": "Quiet."}', "is_error": False},
        {"content": '{"artifact": {}}', "is_error": False},
        email_result,
    ]
    messages: list[dict[str, object]] = [{"role": "user", "content": "go"}]
    for use, result in zip(uses, results, strict=True):
        messages.append({"role": "assistant", "content": [use]})
        block = {"type": "tool_result", "tool_use_id": use["id"], **result}
        messages.append({"role": "user", "content": [block]})
    return Conversation(input={**REPORT, "sources": sources}, messages=messages)  # type: ignore[arg-type]


def test_the_scripted_report_never_claims_an_email_that_was_not_sent() -> None:
    refused = {"content": "send_report_email failed: 400 Bad Request", "is_error": True}
    [closing] = script(_conversation(refused))
    assert closing["text"] == (
        "The nightly report for ops is written, but the email was not sent: "
        "send_report_email failed: 400 Bad Request"
    )
    [closing] = script(_conversation({"content": '{"id": "e1"}', "is_error": False}))
    assert closing["text"] == "The nightly report for ops is written and sent."
