"""The agent offline, with pipeline.testing: its script against stubbed tools on the real step,
the email recorded under its idempotency key and never sent; no service to set up, no model,
no broker, no worker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from oncall_digest.agent import AGENT, mail_digest, read_handover

from pipeline import ToolContext
from pipeline.testing import run_agent, tool_context

RUN = {"team": "ops", "date": "2026-11-29"}
HANDOVER = {"title": "On-call handover", "body": "Primary: Priya."}


def test_the_script_reads_the_handover_then_records_one_email() -> None:
    run = run_agent(AGENT, RUN, tools={"read_handover": HANDOVER})

    assert run.status == "succeeded"
    assert [call.name for call in run.calls] == ["read_handover", "mail_digest"]
    assert run.calls[0].args == {"source": "oncall"}
    (digest,) = run.actions
    assert digest.key == "oncall_digest:2026-11-29:ops" and digest.service == "email"
    assert digest.args["to"] == "oncall-ops@example.com"
    assert digest.args["body"] == "Primary: Priya."
    assert digest.sends == 0 and not digest.requires_approval  # recorded, never sent
    assert run.answer.startswith("Mailed the digest")


def test_the_mail_service_stub_gets_the_key_once() -> None:
    sent: list[tuple[str | None, dict[str, Any]]] = []

    def mail_service(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        sent.append((context.idempotency_key, args))
        return {"delivered": True}

    run = run_agent(AGENT, RUN, tools={"read_handover": HANDOVER, "mail_digest": mail_service})

    assert [key for key, _ in sent] == ["oncall_digest:2026-11-29:ops"]
    assert run.calls[-1].result == {"delivered": True}


def test_the_tools_refuse_wrong_arguments_before_anything_is_called() -> None:
    assert read_handover.argument_errors({"source": "../etc"}) == [
        "source: '../etc' does not match '^[a-z0-9-]{1,40}$'"
    ]
    wrong = {"to": "not an address", "subject": "s", "body": "b"}
    assert mail_digest.argument_errors(wrong) == [
        "to: String should match pattern '^[^@\\s]+@[^@\\s]+$'"
    ]


def test_the_key_is_one_per_team_and_night_whatever_the_mail_says() -> None:
    context = tool_context(AGENT, RUN)
    first = {"to": "a@example.com", "subject": "one", "body": "x"}
    second = {"to": "b@example.com", "subject": "two", "body": "y"}
    assert mail_digest.action_key(first, context) == mail_digest.action_key(second, context)


def test_nothing_is_set_up_and_nothing_is_left_in_home(no_services: Path) -> None:
    run = run_agent(AGENT, RUN, tools={"read_handover": HANDOVER})

    assert run.status == "succeeded"
    assert not [name for name in os.environ if name.startswith("NIGHTSHIFT_")]
    assert _children() == []  # no broker, no worker (pipeline.testing's PostgreSQL is no child)
    assert list(no_services.iterdir()) == []  # nor any data directory in HOME


def _children() -> list[str]:
    tasks = Path("/proc/self/task")
    if not tasks.exists():  # not Linux: nothing to read the children from
        return []
    return [pid for task in tasks.iterdir() for pid in (task / "children").read_text().split()]
