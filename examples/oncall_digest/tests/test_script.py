"""The agent offline: its script and its tools' definitions, no services and no model."""

from __future__ import annotations

import json

from oncall_digest.agent import AGENT, mail_digest, read_handover, script

from pipeline import Conversation

RUN = {"team": "ops", "date": "2026-11-29"}


def test_the_script_reads_the_handover_then_mails_it_once() -> None:
    messages = [AGENT.first_message(RUN)]
    first = script(Conversation(RUN, messages))
    assert first[-1]["name"] == "read_handover"

    handover = {"title": "On-call handover", "body": "Primary: Priya."}
    messages += [
        {"role": "assistant", "content": first},
        {"role": "user", "content": [_result(first[-1]["id"], handover)]},
    ]
    second = script(Conversation(RUN, messages))
    assert second[-1]["name"] == "mail_digest"
    assert second[-1]["input"]["body"] == "Primary: Priya."
    assert mail_digest.argument_errors(second[-1]["input"]) == []


def test_the_tools_refuse_wrong_arguments_before_anything_is_called() -> None:
    assert read_handover.argument_errors({"source": "../etc"}) == [
        "source: '../etc' does not match '^[a-z0-9-]{1,40}$'"
    ]
    wrong = {"to": "not an address", "subject": "s", "body": "b"}
    assert mail_digest.argument_errors(wrong) == [
        "to: String should match pattern '^[^@\\s]+@[^@\\s]+$'"
    ]


def _result(tool_use_id: str, content: dict[str, str]) -> dict[str, str]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": json.dumps(content)}
