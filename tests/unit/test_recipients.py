"""Whom the shipped agents' emails go to: the run's input or the deployment, never the model."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pipeline import PermanentError, ToolContext
from pipeline.agents.invoice_reminders import send_invoice_reminder
from pipeline.agents.nightly_report import report_recipient, send_report_email
from pipeline.settings import Settings


def context(run_input: dict[str, Any], **env: str) -> ToolContext:
    settings = Settings.from_env({"NIGHTSHIFT_DATA_DIR": "/tmp/nightshift-unit", **env})
    return ToolContext(uuid.uuid4(), "nightly_report", "toolu_1", settings, run_input)


def test_the_report_goes_to_the_runs_address_else_the_deployments_else_the_teams() -> None:
    night = {"team": "ops", "date": "2026-11-29"}
    template = {"NIGHTSHIFT_CONFIG_NIGHTLY_REPORT_EMAIL_TO": "{team}-night@acme.example"}
    assert report_recipient(context({**night, "email_to": "lead@acme.example"}, **template)) == (
        "lead@acme.example"
    )
    assert report_recipient(context(night, **template)) == "ops-night@acme.example"
    assert report_recipient(context(night)) == "ops@example.com"
    with pytest.raises(PermanentError, match="not an address"):
        report_recipient(context(night, NIGHTSHIFT_CONFIG_NIGHTLY_REPORT_EMAIL_TO="nobody"))


@pytest.mark.parametrize("tool", [send_report_email, send_invoice_reminder])
def test_no_shipped_email_tool_takes_a_recipient_and_bodies_are_bounded(tool: Any) -> None:
    properties = tool.input_schema["properties"]
    assert not {"to", "cc", "bcc", "email"} & set(properties)
    assert tool.input_schema["additionalProperties"] is False
    assert properties["body"]["maxLength"] <= 20_000
    wrong = tool.argument_errors({"to": "x@evil.example", "subject": "s", "body": "b"})
    assert any("'to'" in problem for problem in wrong)
