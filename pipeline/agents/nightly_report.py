"""The nightly report: read three sources, summarise them, keep the report as an artifact."""

from __future__ import annotations

import json
from typing import Any

import httpx

from pipeline.agents.base import Agent, Block, Conversation, text, tool_use
from pipeline.errors import PermanentError
from pipeline.tools import ArtifactRequest, ToolContext, tool

DEFAULT_SOURCES = ("incidents", "deploys", "oncall")


def service_url(context: ToolContext, attribute: str, variable: str) -> str:
    url: str | None = getattr(context.settings, attribute)
    if not url:
        raise PermanentError(f"{variable} is not set; the tool has no service to talk to")
    return url.rstrip("/")


@tool(
    description="Fetch one report source (incidents, deploys, oncall) from the ops web service.",
    schema={
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"}},
        "required": ["name"],
        "additionalProperties": False,
    },
)
def fetch_source(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    base = service_url(context, "web_url", "NIGHTSHIFT_WEB_URL")
    response = httpx.get(f"{base}/sources/{args['name']}", timeout=10.0)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


@tool(
    description="Save the finished report (markdown) as the run's report artifact.",
    schema={
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 1, "maxLength": 200},
            "body": {"type": "string", "minLength": 1},
        },
        "required": ["title", "body"],
        "additionalProperties": False,
    },
)
def write_report(args: dict[str, Any], context: ToolContext) -> ArtifactRequest:
    # Content-addressed, so writing it again after a crash produces the same file.
    return ArtifactRequest("report", f"# {args['title']}\n\n{args['body']}\n", "text/markdown")


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
        content = None if result.get("is_error") else json.loads(result["content"])
        fetched[name] = fetched.get(name) or content
    return fetched


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


def script(conversation: Conversation) -> list[Block]:
    """One source a step (a failed source is tried twice), then the report, then a closing line."""
    sources = conversation.input.get("sources") or list(DEFAULT_SOURCES)
    step = conversation.assistant_turns()
    fetched = _fetched(conversation)
    for name in sources:
        if fetched.get(name) is None and _attempts(conversation, name) < 2:
            return [text(f"Reading {name}."), tool_use(step, 0, "fetch_source", {"name": name})]
    if not any(block["name"] == "write_report" for block in conversation.tool_uses()):
        title = f"Nightly report for {conversation.input['team']}, {conversation.input['date']}"
        body = _summary(sources, fetched)
        return [tool_use(step, 0, "write_report", {"title": title, "body": body})]
    return [text(f"The nightly report for {conversation.input['team']} is written.")]


def report_written(conversation: Conversation) -> bool:
    return "report" in conversation.state.get("artifacts", {})


AGENT = Agent(
    name="nightly_report",
    system="You are the ops team's night shift. Write short, factual nightly reports.",
    instructions=(
        "Read each source with fetch_source, one at a time, then write the nightly report "
        "with write_report: one bullet per source, the most important fact first."
    ),
    tools=(fetch_source, write_report),
    input_schema={
        "type": "object",
        "properties": {
            "team": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"},
            "date": {"type": "string", "format": "date", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
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
    check_success=report_written,
)
