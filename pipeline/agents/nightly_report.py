"""The nightly report: read three sources, summarise them, keep the report as an artifact."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pipeline import (
    Agent,
    Conversation,
    EventSource,
    PermanentError,
    PersonalData,
    RunPlan,
    Slot,
    ToolContext,
    text,
    tool,
    tool_use,
)
from pipeline.agents.documents import document_tool
from pipeline.agents.services import (
    EMAIL,
    SUBJECT,
    WEB,
    email_effect,
    read_json,
    send_email,
)

DEFAULT_SOURCES = ("incidents", "deploys", "oncall")
ADDRESS = re.compile(r"^[^@\x00-\x20\x7f-\xa0]+@[^@\x00-\x20\x7f-\xa0]+$")
r"""No space, control character or second @. Spelled without \s or \d, as every input pattern
here is: the API's OpenAPI document declares it, where it reads as ECMA-262 (whose \s is not
Python's) and means the same."""
MAX_BODY = 20_000
"""Characters in the report email's body."""


@tool(
    description="Fetch one report source (incidents, deploys, oncall) from the ops web service.",
    schema={
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"}},
        "required": ["name"],
        "additionalProperties": False,
    },
    needs=(WEB,),
)
def fetch_source(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return read_json(context, WEB, f"/sources/{args['name']}")


write_report = document_tool(
    "write_report", "report", "Save the finished report (markdown) as the run's report artifact."
)


def report_key(args: dict[str, Any], context: ToolContext) -> str:
    """One nightly report email per team and night, whatever crashes in between:
    `nightly_report:2026-11-29:ops`."""
    return f"{context.run_input['date']}:{context.run_input['team']}"


def report_recipient(context: ToolContext) -> str:
    """Whom the report goes to: the run's `email_to` (set by whoever started it), else the
    deployment's `nightly_report.email_to` (`{team}` stands for the team), else
    `<team>@example.com`. Never an address the model wrote."""
    team = context.run_input["team"]
    configured = context.config("nightly_report.email_to", "{team}@example.com")
    to = str(context.run_input.get("email_to") or configured.replace("{team}", team))
    if not ADDRESS.match(to):
        raise PermanentError(f"nightly_report.email_to gives {to!r} for {team}: not an address")
    return to


@tool(
    description=(
        "Email the finished nightly report to the team. The recipient is fixed by the run "
        "(the team's address); you write the subject and the body."
    ),
    schema={
        "type": "object",
        "properties": {
            "subject": SUBJECT,
            "body": {"type": "string", "minLength": 1, "maxLength": MAX_BODY},
        },
        "required": ["subject", "body"],
        "additionalProperties": False,
    },
    side_effect=email_effect(report_key),
    needs=(EMAIL,),
)
def send_report_email(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return send_email(context, report_recipient(context), args["subject"], args["body"])


def _fetched(conversation: Conversation) -> dict[str, dict[str, Any] | None]:
    """Each source asked for so far -> its content, or None while it has only failed."""
    asked = {
        block["id"]: block["input"].get("name")
        for block in conversation.tool_uses()
        if block["name"] == "fetch_source"
    }
    fetched: dict[str, dict[str, Any] | None] = {}
    for result in conversation.tool_results():
        name = asked.get(result["tool_use_id"])
        if not isinstance(name, str):
            continue
        content = None if result.get("is_error") else _source(name, result["content"])
        fetched[name] = fetched.get(name) or content
    return fetched


def _source(name: str, content: str) -> dict[str, Any]:
    """A fetched source; a large one arrives as an artifact preview rather than JSON."""
    try:
        parsed = json.loads(content)
    except ValueError:
        return {"name": name, "title": name, "body": content}
    return parsed if isinstance(parsed, dict) else {"name": name, "body": content}


def _attempts(conversation: Conversation, source: str) -> int:
    return sum(1 for block in conversation.tool_uses() if block["input"].get("name") == source)


def _summary(sources: list[str], fetched: dict[str, dict[str, Any] | None]) -> str:
    lines = []
    for name in sources:
        source = fetched.get(name)
        if source is None:
            lines.append(f"- **{name}**: unavailable tonight")
            continue
        first = source.get("body", "").split(". ")[0].strip()
        lines.append(f"- **{source.get('title', name)}**: {first}")
    return "\n".join(lines)


def script(conversation: Conversation) -> list[dict[str, Any]]:
    """One source a step (a failed source is tried twice), then the report, then a closing line."""
    sources = conversation.input.get("sources") or list(DEFAULT_SOURCES)
    step = conversation.assistant_turns()
    fetched = _fetched(conversation)
    for name in sources:
        if fetched.get(name) is None and _attempts(conversation, name) < 2:
            return [text(f"Reading {name}."), tool_use(step, 0, "fetch_source", {"name": name})]
    used = {block["name"] for block in conversation.tool_uses()}
    team = conversation.input["team"]
    title = f"Nightly report for {team}, {conversation.input['date']}"
    body = _summary(sources, fetched)
    if "write_report" not in used:
        return [tool_use(step, 0, "write_report", {"title": title, "body": body})]
    if "send_report_email" not in used:
        email = {"subject": title, "body": body[:MAX_BODY]}
        return [tool_use(step, 0, "send_report_email", email)]
    return [text(_closing(conversation, team))]


def _closing(conversation: Conversation, team: str) -> str:
    """Say what happened, never more: an error result means that part did not happen."""
    written = _error_of(conversation, "write_report")
    sent = _error_of(conversation, "send_report_email")
    if written is None and sent is None:
        return f"The nightly report for {team} is written and sent."
    if written is None:
        return f"The nightly report for {team} is written, but the email was not sent: {sent}"
    if sent is None:
        return f"The nightly report for {team} was emailed, but saving it failed: {written}"
    return f"The nightly report for {team} was neither saved ({written}) nor sent ({sent})."


def _error_of(conversation: Conversation, tool: str) -> str | None:
    """The last result of `tool`'s calls: None when it succeeded, else its error text."""
    uses = {b["id"] for b in conversation.tool_uses() if b["name"] == tool}
    results = [r for r in conversation.tool_results() if r["tool_use_id"] in uses]
    if results and not results[-1].get("is_error"):
        return None
    return str(results[-1]["content"]) if results else "no result"


def report_job(slot: Slot) -> RunPlan:
    """A report for the schedule's team, dated the slot's local date."""
    return RunPlan({"team": slot.params.get("team"), "date": slot.date})


def report_request(payload: Mapping[str, Any]) -> dict[str, Any]:
    """An ops tool asks for a report out of schedule (after an incident, say):
    {"team": "ops", "date": "2026-11-29", optional "email_to", "sources"}."""
    run_input = {"team": payload["team"], "date": payload["date"]}
    return run_input | {k: payload[k] for k in ("email_to", "sources") if k in payload}


def report_written_and_sent(conversation: Conversation) -> bool:
    sent = any(
        not result.get("is_error") and result["tool_use_id"] in _email_uses(conversation)
        for result in conversation.tool_results()
    )
    return sent and "report" in conversation.state.get("artifacts", {})


def _email_uses(conversation: Conversation) -> set[str]:
    return {b["id"] for b in conversation.tool_uses() if b["name"] == "send_report_email"}


AGENT = Agent(
    name="nightly_report",
    system="You are the ops team's night shift. Write short, factual nightly reports.",
    instructions=(
        "Read each source with fetch_source, one at a time, then write the nightly report "
        "with write_report (one bullet per source, the most important fact first) and email "
        "it to the team with send_report_email."
    ),
    tools=(fetch_source, write_report, send_report_email),
    input_schema={
        "type": "object",
        "properties": {
            "team": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"},
            "date": {"type": "string", "format": "date", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
            "email_to": {"type": "string", "pattern": ADDRESS.pattern},
            "sources": {
                "type": "array",
                "items": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"},
                "minItems": 1,
                "maxItems": 10,
            },
        },
        "required": ["team", "date"],
        "additionalProperties": False,
    },
    script=script,
    max_steps=12,
    check_success=report_written_and_sent,
    job=report_job,
    event_sources=(EventSource("ops-report-request", report_request),),
    # The address a caller sent it to, and the report's text (the on-call handover names
    # people); the team, date, subject and the delivery's id and time stay.
    personal_data=PersonalData(
        input=("email_to",),
        tools={"send_report_email": ("args.body", "result.to")},
    ),
)
