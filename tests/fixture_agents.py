"""Agents only tests register, through NIGHTSHIFT_AGENTS, the way a user's own module is."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
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
    check_back_in,
    once,
    text,
    tool,
    tool_use,
)
from pipeline.agents import nightly_report
from pipeline.agents.documents import document_tool
from pipeline.agents.services import (
    EMAIL,
    GITHOST,
    WEB,
    email_effect,
    find_pull_of_action,
    open_pull_request,
    read_json,
    send_email,
)
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


def _shout_for_ever(conversation: Conversation) -> list[dict[str, Any]]:
    """Shout once more every step, never done: only a limit ends its runs."""
    step = len(conversation.tool_results())
    return [tool_use(step, 0, "shout", {"word": f"again{step}"})]


ENDLESS = dataclasses.replace(ECHO, name="endless_shout", script=_shout_for_ever, max_steps=200)
ENDLESS_TOOL_CALLS = dataclasses.replace(ENDLESS, name="endless_tool_calls", max_tool_calls=3)
ENDLESS_TOKENS = dataclasses.replace(ENDLESS, name="endless_tokens", max_run_tokens=400)
ENDLESS_STEPS = dataclasses.replace(ENDLESS, name="endless_steps", max_steps=4)
"""The same endless agent, each stopped by one per-run limit."""

NOT_AN_AGENT = {"name": "a dict, not an agent"}

LAZY_AS_REPORT = dataclasses.replace(LAZY_REPORT, name="nightly_report")
"""Another agent that calls itself nightly_report: a name clash."""


CAPPED_REPORT = dataclasses.replace(
    nightly_report.AGENT, name="capped_report", max_run_cost_usd=0.05, event_sources=()
)
"""The nightly report with a per-run money cap."""


def _approval_without_effect() -> Tool:
    """A tool that claims to need approval but has no side effect: `Tool` refuses to define one
    (pipeline/tools/definition.py), so this one is forced past that check, as a tool from an
    older or patched release might be. It must never run."""

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
        lookup=find_pull_of_action,
    ),
    needs=(GITHOST,),
    requires_approval=True,
)
def open_pull(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return open_pull_request(context, args["repo"], args["branch"], "main", "A fix", "For review.")


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


# -- the notifier and its next releases (deploying while runs wait) -------------------------

NOTICE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"subject": {"type": "string"}, "body": {"type": "string"}},
    "required": ["subject", "body"],
    "additionalProperties": False,
}


def _notify_once(conversation: Conversation) -> list[dict[str, Any]]:
    """Notify the team and note the incident in one reply, then say what came back."""
    if not conversation.tool_results():
        notice = {"subject": f"Incident {conversation.input['id']}", "body": "Resolved."}
        return [tool_use(0, 0, "notify_team", notice), tool_use(0, 1, "note_incident", {})]
    return [text(f"Notified: {conversation.tool_results()[0]['content']}")]


@tool(
    description="Note that the incident was handled (local, read-only).", schema={"type": "object"}
)
def note_incident(args: dict[str, Any], context: ToolContext) -> str:
    return f"noted {context.run_input['id']}"


def _notify_tool(
    key: Callable[[dict[str, Any], ToolContext], str],
    schema: dict[str, Any] = NOTICE_SCHEMA,
    service: str = "email",
) -> Tool:
    def notify_team(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        to = f"{context.run_input['team']}@example.com"
        return send_email(context, to, args["subject"], args["body"])

    effect = dataclasses.replace(email_effect(key), service=service)
    made = tool(
        description="Email the team a notification about the incident.",
        schema=schema,
        side_effect=effect,
        needs=(EMAIL,),
    )
    return made(notify_team)


def _by_id(args: dict[str, Any], context: ToolContext) -> str:
    return f"{context.run_input['id']}"


NOTIFIER = Agent(
    name="notifier",
    system="You tell the team about incidents.",
    instructions="Notify the team once with notify_team, and note the incident.",
    tools=(_notify_tool(_by_id), note_incident),
    input_schema={"type": "object", "required": ["team", "id"]},
    script=_notify_once,
)
NOTIFIER_REKEYED = dataclasses.replace(
    NOTIFIER,
    tools=(
        _notify_tool(lambda a, c: f"{c.run_input['team']}-{c.run_input['id']}"),
        note_incident,
    ),
)
"""The next release: its key function went from `{id}` to `{team}-{id}` (code: a new agent
version, pipeline/code_digest.py)."""
NOTIFIER_NEXT = dataclasses.replace(
    NOTIFIER_REKEYED, instructions="Notify the team once with notify_team; note the incident."
)
"""The next release as a deployment meets it: the new key function and new instructions."""
NOTIFIER_STRICTER = dataclasses.replace(
    NOTIFIER,
    tools=(
        _notify_tool(
            _by_id,
            schema={**NOTICE_SCHEMA, "required": ["subject", "body", "severity"]},
        ),
        note_incident,
    ),
)
"""The next release: notify_team's schema requires a severity the journaled call lacks."""
NOTIFIER_TO_CHAT = dataclasses.replace(
    NOTIFIER, tools=(_notify_tool(_by_id, service="chat"), note_incident)
)
"""The next release: notify_team's side effect is declared as another service."""


def _notify_channel_once(conversation: Conversation) -> list[dict[str, Any]]:
    """The renamed release: notify until one notification went through, then say so."""
    if not any(not r.get("is_error") for r in conversation.tool_results()):
        notice = {"subject": f"Incident {conversation.input['id']}", "body": "Resolved."}
        return [tool_use(conversation.assistant_turns(), 0, "notify_channel", notice)]
    return [text(f"Notified: {conversation.tool_results()[-1]['content']}")]


def _renamed(policy: str) -> Agent:
    """The next release: notify_team is notify_channel now, and the prompt is new."""
    renamed = dataclasses.replace(_notify_tool(_by_id), name="notify_channel")
    return dataclasses.replace(
        NOTIFIER,
        system="You tell the team about incidents, in one short line.",
        tools=(renamed,),
        script=_notify_channel_once,
        on_version_change=policy,
    )


NOTIFIER_RENAMED = _renamed("continue")
NOTIFIER_RENAMED_PARKS = _renamed("park")
NOTIFIER_RENAMED_FAILS = _renamed("fail")

NOTIFY_SUMMARY = Agent(
    name="notify_summary",
    system="You sum up a batch of notifications.",
    instructions="Say how many incidents were notified.",
    tools=(),
    input_schema={"type": "object"},
    script=lambda conversation: [text(f"{len(conversation.input['children'])} notified.")],
)


def _write_one_report(conversation: Conversation) -> list[dict[str, Any]]:
    """Write the report (an artifact) in the first reply, then say so."""
    if conversation.tool_results():
        return [text("Saved.")]
    body = {"title": f"Report for {conversation.input['team']}", "body": "All quiet tonight."}
    return [tool_use(0, 0, "write_report", body)]


REPORT_WRITER = Agent(
    name="report_writer",
    system="You write one short report.",
    instructions="Save the report with write_report.",
    tools=(document_tool("write_report", "report", "Save the report (markdown)."),),
    input_schema={"type": "object", "properties": {"team": {"type": "string"}}},
    script=_write_one_report,
)


@tool
def fetch_status(url: str, context: ToolContext) -> dict[str, Any]:
    """Fetch a URL with the tool's own HTTP client and say what status came back."""
    return {"status": httpx.get(url, timeout=5).status_code}


def _fetch_the_input_url(conversation: Conversation) -> list[dict[str, Any]]:
    if conversation.tool_results():
        return [text(f"Fetched: {conversation.tool_results()[-1]['content']}")]
    return [tool_use(0, 0, "fetch_status", {"url": conversation.input["url"]})]


PAGE_FETCHER = Agent(
    name="page_fetcher",
    system="You fetch one page.",
    instructions="Fetch the input's URL with fetch_status.",
    tools=(fetch_status,),
    input_schema={"type": "object", "properties": {"url": {"type": "string"}}},
    script=_fetch_the_input_url,
)
"""A tool that calls a URL with credentials and a query in it, as a user's tool may."""


# -- a batch whose last children wait on a timer, and its synthesis -------------------------


def _now_or_later(conversation: Conversation) -> list[dict[str, Any]]:
    """Answer at once, or (input `later`) only after an hour on a timer."""
    word = conversation.input["word"]
    if conversation.input.get("later") and not conversation.tool_results():
        return [tool_use(0, 0, "check_back_in", {"seconds": 3600, "reason": "later"})]
    return [text(f"Heard: {word.upper()}")]


NOW_OR_LATER = Agent(
    name="now_or_later",
    system="You answer now, or in an hour.",
    instructions="Say the input's word loudly; if the input says later, wait an hour first.",
    tools=(check_back_in,),
    input_schema={"type": "object", "required": ["word"]},
    script=_now_or_later,
)


def _sum_up(conversation: Conversation) -> list[dict[str, Any]]:
    """The children's results; a batch a cap stopped first says so, what stopped and why."""
    children = conversation.input["children"]
    heard = "; ".join(
        f"{c['item']['word']}: {c['result']}" for c in children if c["status"] == "succeeded"
    )
    stopped = conversation.input.get("stopped")
    if not stopped:
        return [text(f"Results: {heard}.")]
    words = ", ".join(item["word"] for item in stopped["stopped"])
    return [
        text(
            f"PARTIAL: the batch was stopped ({stopped['reason']}: {stopped['why']}); "
            f"{stopped['finished']} finished, stopped: {words}. Results: {heard}."
        )
    ]


SUM_UP = Agent(
    name="sum_up",
    system="You sum up a batch.",
    instructions="List what each child answered; say if the batch was stopped.",
    tools=(),
    input_schema={"type": "object"},
    script=_sum_up,
)


@tool(
    name="read_acme_ticket",
    description="Read a ticket from Acme's own tracker (a team's own service: no sandbox for it).",
    schema={"type": "object", "properties": {}},
    needs=("acme.url",),
)
def read_acme_ticket(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return {"ticket": context.config("acme.url")}


ACME_TRIAGE = dataclasses.replace(ECHO, name="acme_triage", tools=(read_acme_ticket,))
"""An agent whose tool needs a team's own setting, NIGHTSHIFT_CONFIG_ACME_URL."""


# -- a run worth forking: two emails, a status read, and an email of that status -------------


def _email_team(context: ToolContext, subject: str) -> dict[str, Any]:
    return send_email(context, f"{context.run_input['team']}@example.com", subject, subject)


@tool(
    description="Email the team one part of the report.",
    schema={"type": "object", "properties": {"part": {"type": "integer"}}, "required": ["part"]},
    side_effect=email_effect(lambda a, c: f"{c.run_input['id']}:part-{a['part']}"),
    needs=(EMAIL,),
)
def send_part(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    sent = _email_team(context, f"Part {args['part']}")
    context.state.set("parts_sent", [*context.state.get("parts_sent", []), args["part"]])
    return sent


@tool(
    description="Read the service's status page (read-only): its title.",
    schema={"type": "object", "properties": {}},
    needs=(WEB,),
)
def read_status(args: dict[str, Any], context: ToolContext) -> str:
    return str(read_json(context, WEB, "/sources/status")["title"])


@tool(
    description="Email the team the service's status.",
    schema={"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]},
    side_effect=email_effect(lambda a, c: f"{c.run_input['id']}:status:{a['status']}"),
    needs=(EMAIL,),
)
def send_status(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return _email_team(context, f"Status: {args['status']}")


def _parts_then_status(conversation: Conversation) -> list[dict[str, Any]]:
    """Step 0 and 1 email a part each, step 2 reads the status page, step 3 emails what it
    said, step 4 answers."""
    turn = conversation.assistant_turns()
    if turn < 2:
        return [tool_use(turn, 0, "send_part", {"part": turn + 1})]
    if turn == 2:
        return [tool_use(turn, 0, "read_status", {})]
    status = conversation.tool_results()[2]["content"]
    if turn == 3:
        return [tool_use(turn, 0, "send_status", {"status": status})]
    return [text(f"Sent parts 1 and 2 and the status ({status}).")]


STATUS_REPORTER = Agent(
    name="status_reporter",
    system="You send a report in parts, then the service's status.",
    instructions="Email parts 1 and 2, read the status page, email its status.",
    tools=(send_part, read_status, send_status),
    input_schema={"type": "object", "required": ["team", "id"]},
    script=_parts_then_status,
)
"""Steps 0-1 confirm an email each, step 2 reads a page, step 3 emails what the page said."""
