"""Agents only tests register, through NIGHTSHIFT_AGENTS, the way a user's own module is."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from pipeline import (
    Agent,
    BatchPlan,
    Conversation,
    EventSource,
    PermanentError,
    SideEffect,
    Slot,
    ToolContext,
    once,
    text,
    tool,
    tool_use,
)
from pipeline.agents import nightly_report
from pipeline.agents.services import GITHOST, find_open_pull, open_pull_request
from pipeline.tools import Tool


def _claims_done_too_early(conversation: Conversation) -> list[dict[str, Any]]:
    """The nightly report's script, except that it says "All done!" instead of emailing the
    report, until the success check has sent it back to work once."""
    blocks = nightly_report.script(conversation)
    nudged = any(
        b.get("type") == "text" and "check failed" in b.get("text", "")
        for m in conversation.messages
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
    )
    if not nudged and any(b.get("name") == "send_report_email" for b in blocks):
        return [text("All done!")]
    return blocks


LAZY_REPORT = dataclasses.replace(
    nightly_report.AGENT, name="lazy_report", script=_claims_done_too_early, event_sources=()
)


def _two_team_reports(slot: Slot) -> BatchPlan:
    """A batch of two report runs: the shape of the competitor monitor's fan-out."""
    children: list[dict[str, Any]] = [{"team": t, "date": slot.date} for t in ("ops", "pricing")]
    return BatchPlan(
        batch_id=slot.key,
        name="test_batch",
        child_agent="nightly_report",
        child_inputs=children,
        synthesis_agent="price_synthesis",
        params={},
    )


TEST_BATCH = Agent(
    name="test_batch",
    system="A schedule's batch job for tests; it never runs itself.",
    instructions="Nothing to do.",
    tools=(),
    input_schema={"type": "object"},
    script=lambda conversation: [text("Nothing to do.")],
    job=_two_team_reports,
)


def _echo_script(conversation: Conversation) -> list[dict[str, Any]]:
    """Echo the input's word once, then say what came back."""
    if not conversation.tool_results():
        return [tool_use(0, 0, "shout", {"word": conversation.input["word"]})]
    return [text(f"Heard: {conversation.tool_results()[-1]['content']}")]


@tool(
    description="Say a word louder (a local read-only tool).",
    schema={
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 40}},
        "required": ["word"],
        "additionalProperties": False,
    },
)
def shout(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return {"loud": args["word"].upper()}


ECHO = Agent(
    name="echo_outside",
    system="You are an agent that lives outside nightshift's package.",
    instructions="Shout the input's word with the shout tool, then say what you heard.",
    tools=(shout,),
    input_schema={
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 40}},
        "required": ["word"],
    },
    script=_echo_script,
)

NOT_AN_AGENT = {"name": "a dict, not an agent"}

LAZY_AS_REPORT = dataclasses.replace(LAZY_REPORT, name="nightly_report")
"""Another agent that calls itself nightly_report: a name clash."""


CAPPED_REPORT = dataclasses.replace(
    nightly_report.AGENT, name="capped_report", max_run_cost_usd=0.05, event_sources=()
)
"""The nightly report with a per-run money cap."""


def _approval_without_effect() -> Tool:
    """A tool that claims to need approval but has no side effect: tools.py refuses to define
    one, so this one is forced past that check, as a tool from an older or patched release
    might be. It must never run."""

    def grant(args: dict[str, Any], context: ToolContext) -> str:
        return "GRANTED WITHOUT APPROVAL"

    made = tool(description="Grant a discount.", schema={"type": "object"})(grant)
    object.__setattr__(made, "requires_approval", True)
    return made


def _grant_once(conversation: Conversation) -> list[dict[str, Any]]:
    if conversation.tool_results():
        return [text("Done.")]
    return [tool_use(conversation.assistant_turns(), 0, "grant", {})]


UNGUARDED = Agent(
    name="unguarded",
    system="Tests the engine's own approval check.",
    instructions="Grant the discount.",
    tools=(_approval_without_effect(),),
    input_schema={"type": "object"},
    script=_grant_once,
)


@tool(
    description="Open a pull request for the issue's branch, once a person approves.",
    schema={
        "type": "object",
        "properties": {"repo": {"type": "string"}, "branch": {"type": "string"}},
        "required": ["repo", "branch"],
        "additionalProperties": False,
    },
    side_effect=SideEffect(
        service="githost",
        key=lambda args, context: f"{args['repo']}:{args['branch']}",
        lookup=find_open_pull,
    ),
    needs=(GITHOST,),
    requires_approval=True,
)
def open_pull(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return open_pull_request(context, args["repo"], args["branch"], "A fix", "For review.")


def _asks_for_approval(conversation: Conversation) -> list[dict[str, Any]]:
    if not conversation.tool_results():
        branch = f"patch/issue-{conversation.input['issue']}"
        return [tool_use(0, 0, "open_pull", {"repo": conversation.input["repo"], "branch": branch})]
    return [text(f"Done: {conversation.tool_results()[-1]['content']}")]


APPROVAL_ONLY = Agent(
    name="approval_only",
    system="You open one pull request per issue, after a person approves it.",
    instructions="Open the pull request with open_pull.",
    tools=(open_pull,),
    input_schema={"type": "object", "required": ["issue", "repo"]},
    script=_asks_for_approval,
)
"""Patch's approval without its repository work: a thousand waiting runs cost no git."""


def _report_for(payload: Mapping[str, Any]) -> dict[str, Any]:
    return {"team": payload["team"], "date": payload["date"]}


# Reports other services ask for: an incident report must be done within half an hour; a
# customer request says itself how long it may take ("respond_within", any deadline form).
DEADLINED_REPORT = dataclasses.replace(
    nightly_report.AGENT,
    name="deadlined_report",
    event_sources=(
        EventSource("incident-report", _report_for, deadline=timedelta(minutes=30)),
        EventSource(
            "customer-report", _report_for, deadline=lambda payload: payload.get("respond_within")
        ),
    ),
)


CLAUDE_ONLY = Agent(
    name="claude_only",
    system="You run only on the real model.",
    instructions="Say hello.",
    tools=(),
    input_schema={"type": "object"},
)
"""An agent with no script: it needs ANTHROPIC_API_KEY."""


# -- a typed tool ----------------------------------------------------------------------------


class Reminder(BaseModel):
    client: str = Field(pattern="^[a-z]+$")
    days_overdue: int = Field(ge=1)


@tool
def note_reminder(reminder: Reminder, context: ToolContext) -> dict[str, Any]:
    """Note that a client should be reminded of an overdue invoice."""
    assert isinstance(reminder, Reminder)  # the tool gets the typed value, not the dict
    return {"client": reminder.client, "days": reminder.days_overdue}


@tool
def call_acme(context: ToolContext) -> str:
    """Call the Acme API (it refuses, and its error names the token)."""
    raise PermanentError(f"401 for token {context.config('acme.token')}")


def _typed_script(conversation: Conversation) -> list[dict[str, Any]]:
    """A wrong argument first, then the right one; then a call that fails; then done."""
    step = conversation.assistant_turns()
    if step == 0:
        wrong = {"client": "Acme!", "days_overdue": "soon"}
        return [tool_use(step, 0, "note_reminder", wrong)]
    if step == 1:
        return [tool_use(step, 0, "note_reminder", {"client": "acme", "days_overdue": 3})]
    if step == 2:
        return [tool_use(step, 0, "call_acme", {})]
    return [text("noted: " + conversation.tool_results()[1]["content"])]


TYPED_REMINDERS = Agent(
    name="typed_reminders",
    system="You note reminders with a typed tool.",
    instructions="Note a reminder for acme.",
    tools=(note_reminder, call_acme),
    input_schema={"type": "object"},
    script=_typed_script,
)


# -- once ------------------------------------------------------------------------------------


def _allocate(context: ToolContext) -> int:
    """Hand out the next invoice number, and leave a line for each number handed out."""
    log = Path(context.config("numbers.log"))
    with log.open("a") as handle:
        handle.write("allocated\n")
    return 1000 + len(log.read_text().splitlines())


@tool
def number_invoice(client: str, context: ToolContext) -> dict[str, Any]:
    """Give the client's invoice a number of its own."""
    number = once(f"invoice-number:{client}", lambda: _allocate(context))
    return {"client": client, "number": number}


def _numbering_script(conversation: Conversation) -> list[dict[str, Any]]:
    step = conversation.assistant_turns()
    if step == 0:
        return [tool_use(step, 0, "number_invoice", {"client": "acme"})]
    return [text("numbered: " + conversation.tool_results()[0]["content"])]


NUMBERED_INVOICES = Agent(
    name="numbered_invoices",
    system="You number invoices.",
    instructions="Number acme's invoice.",
    tools=(number_invoice,),
    input_schema={"type": "object"},
    script=_numbering_script,
)
