"""Whom the shipped agents' emails go to: the run's input or the deployment, never the model."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pipeline import PermanentError, ToolContext
from pipeline.agents.invoice_reminders import send_invoice_reminder
from pipeline.agents.nightly_report import report_recipient, send_report_email
from pipeline.agents.services import send_email
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


@pytest.mark.parametrize("tool", [send_report_email, send_invoice_reminder])
def test_a_subject_that_would_break_its_header_is_refused_as_an_argument(tool: Any) -> None:
    others = {"client": "acme"} if "client" in tool.input_schema["properties"] else {}
    for broken in ("Report\r\nBcc: x@evil.example", "Report\nBcc: x@evil.example", "a\x00b"):
        wrong = tool.argument_errors({**others, "subject": broken, "body": "b"})
        assert [problem.split(":")[0] for problem in wrong] == ["subject"], (broken, wrong)
    assert tool.argument_errors({**others, "subject": "Réunion: ok", "body": "b"}) == []


def test_an_email_whose_header_fields_break_a_line_is_not_sent() -> None:
    # whatever wrote them (a service's record, a tool of a user's own): nothing is sent, and the
    # email API's URL is not even asked for (none is configured here)
    night = context({"team": "ops", "date": "2026-11-29"})
    for to, subject in [("ops@acme.example\r\nBcc: x@evil.example", "s"),
                        ("ops@acme.example", "s\nBcc: x@evil.example")]:  # fmt: skip
        with pytest.raises(PermanentError, match="could start a header of its own"):
            send_email(night, to, subject, "body")
