"""Invoice reminders: every Monday, one reminder email per client and ISO week, however many
invoices the client has overdue (the email lists them all).

One reminder per step, so a crash after the third email resumes at the fourth, and the key
`invoice-reminder:<client>:<iso-week>` makes a second run in the same week send nothing again
(keys were per invoice and week before; migration 0017 carried the sent ones over, and for a
client with none sent, one whose outcome was still open, which a rerun waits for). The model
names the client and writes the text; whom it goes to is the client's own record at the
billing service, so a page the model read cannot add or change a recipient.
"""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

from pipeline import (
    Agent,
    Conversation,
    PermanentError,
    PersonalData,
    RunPlan,
    Slot,
    ToolContext,
    http_deadline,
    text,
    tool,
    tool_use,
)
from pipeline.agents.services import (
    EMAIL,
    SECONDS,
    SUBJECT,
    WEB,
    email_effect,
    read_json,
    send_email,
    service_url,
)

MAX_TRIES = 2
"""Calls of one tool for one thing (the list, a client's reminder) before moving on."""

_CLIENT = "^[a-z0-9][a-z0-9_-]{0,59}$"
_ADDRESS = re.compile(r"^[^@\s]+@[^@\s]+$")
MAX_BODY = 2000
"""Characters in a reminder's body: a short, polite note, not a newsletter."""


def iso_week(day: str) -> str:
    """`2026-11-30` -> `2026-W49` (the ISO year, which differs from the calendar year in
    the last days of December and the first days of January)."""
    year, week, _ = date.fromisoformat(day).isocalendar()
    return f"{year}-W{week:02d}"


# -- the job --------------------------------------------------------------------------------


def reminders_job(slot: Slot) -> RunPlan:
    """One run per slot, dated the slot's local date (its ISO week keys the reminders)."""
    return RunPlan({"date": slot.date})


# -- tools ----------------------------------------------------------------------------------


@tool(
    description="List the overdue invoices: client, name, email, invoice, amount, due date.",
    schema={"type": "object", "properties": {}, "additionalProperties": False},
    needs=(WEB,),
)
def list_overdue_invoices(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return read_json(context, WEB, "/invoices/overdue")


def reminder_key(args: dict[str, Any], context: ToolContext) -> str:
    """One reminder per client and ISO week, whichever run (or rerun) of the week sends it."""
    return f"{args['client']}:{iso_week(context.run_input['date'])}"


NAMESPACE = "invoice-reminder"
"""Keys are `invoice-reminder:<client>:<iso week>`, as the seed names them."""


def client_record(context: ToolContext, client: str) -> dict[str, Any]:
    """The billing service's record of a client with overdue invoices (contact, invoices);
    PermanentError if it has none, or the record has no usable address."""
    base = service_url(context, WEB)
    response = http_deadline.request("GET", f"{base}/clients/{client}/overdue", SECONDS)
    if response.status_code == 404:
        raise PermanentError(
            f"no client {client!r} with overdue invoices at the billing service; nothing was sent"
        )
    response.raise_for_status()
    record: dict[str, Any] = response.json()
    if record.get("client") != client:
        raise PermanentError(f"the billing service has no client exactly named {client!r}")
    if not _ADDRESS.match(str(record.get("email", ""))):
        raise PermanentError(f"client {client}'s record has no email address; not sent")
    return record


@tool(
    description=(
        "Email one client a payment reminder for all their overdue invoices. It goes to the "
        "contact on the client's record at the billing service; you write the subject and the "
        "body."
    ),
    schema={
        "type": "object",
        "properties": {
            "client": {"type": "string", "pattern": _CLIENT},
            "subject": SUBJECT,
            "body": {"type": "string", "minLength": 1, "maxLength": MAX_BODY},
        },
        "required": ["client", "subject", "body"],
        "additionalProperties": False,
    },
    side_effect=email_effect(reminder_key, namespace=NAMESPACE),
    needs=(WEB, EMAIL),
)
def send_invoice_reminder(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    record = client_record(context, args["client"])
    return send_email(context, record["email"], args["subject"], args["body"])


# -- the script -----------------------------------------------------------------------------


def _calls(conversation: Conversation, name: str) -> dict[str, dict[str, Any]]:
    return {b["id"]: b["input"] for b in conversation.tool_uses() if b["name"] == name}


def _overdue(conversation: Conversation) -> list[dict[str, Any]] | None:
    asked = _calls(conversation, "list_overdue_invoices")
    for result in conversation.tool_results():
        if result["tool_use_id"] in asked and not result.get("is_error"):
            invoices: list[dict[str, Any]] = json.loads(result["content"]).get("invoices", [])
            return invoices
    return None


def _reminders(conversation: Conversation) -> dict[str, list[bool]]:
    """Client -> whether each reminder call so far succeeded."""
    asked = _calls(conversation, "send_invoice_reminder")
    outcomes: dict[str, list[bool]] = {}
    for result in conversation.tool_results():
        args = asked.get(result["tool_use_id"])
        if args is not None:
            outcomes.setdefault(args["client"], []).append(not result.get("is_error"))
    return outcomes


def by_client(invoices: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The overdue invoices grouped by client, in the order the list names the clients."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for invoice in invoices:
        grouped.setdefault(invoice["client"], []).append(invoice)
    return grouped


def _amount(invoice: dict[str, Any]) -> str:
    return f"{float(invoice['amount']):,.2f} {invoice['currency']}"


def reminder(invoices: list[dict[str, Any]], week: str) -> dict[str, Any]:
    """One client's reminder, naming each of their overdue invoices."""
    first = invoices[0]
    lines = "\n".join(
        f"- invoice {i['invoice']} for {_amount(i)}, due on {i['due_date']}" for i in invoices
    )
    body = (
        f"Dear {first['name']},\n\n"
        f"the following {'invoice is' if len(invoices) == 1 else 'invoices are'} still open:\n"
        f"{lines}\n\n"
        "Please arrange payment, or reply if it has crossed with this email.\n\n"
        f"Kind regards,\nAccounts receivable ({week})"
    )
    count = f"{len(invoices)} overdue invoice{'s' if len(invoices) > 1 else ''}"
    return {
        "client": first["client"],
        "subject": f"Reminder: {count} ({', '.join(i['invoice'] for i in invoices)})"[:200],
        "body": body[:MAX_BODY],
    }


def script(conversation: Conversation) -> list[dict[str, Any]]:
    """The list once, then one reminder per client a step, then a closing line."""
    step = conversation.assistant_turns()
    week = iso_week(conversation.input["date"])
    invoices = _overdue(conversation)
    if invoices is None:
        if len(_calls(conversation, "list_overdue_invoices")) < MAX_TRIES:
            return [
                text("Listing overdue invoices."),
                tool_use(step, 0, "list_overdue_invoices", {}),
            ]
        return [text("The overdue invoices could not be listed; no reminders were sent.")]
    done = _reminders(conversation)
    for client, theirs in by_client(invoices).items():
        tries = done.get(client, [])
        if not any(tries) and len(tries) < MAX_TRIES:
            return [tool_use(step, 0, "send_invoice_reminder", reminder(theirs, week))]
    sent = sorted(c for c, tries in done.items() if any(tries))
    failed = sorted(c for c, tries in done.items() if not any(tries))
    return [
        text(
            f"Invoice reminders for {week}: {len(sent)} sent ({', '.join(sent) or 'none'}); "
            f"{len(failed)} failed ({', '.join(failed) or 'none'})."
        )
    ]


AGENT = Agent(
    name="invoice_reminders",
    system="You chase overdue invoices politely: one short reminder per client and week.",
    instructions=(
        "List the overdue invoices with list_overdue_invoices, then send each client with "
        "overdue invoices one reminder naming all of them with send_invoice_reminder, one "
        "client at a time. Finish with a line saying who was reminded and whose reminder failed."
    ),
    tools=(list_overdue_invoices, send_invoice_reminder),
    input_schema={
        "type": "object",
        "properties": {
            "date": {"type": "string", "format": "date", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        },
        "required": ["date"],
        "additionalProperties": False,
    },
    script=script,
    # The client's contact and what the email said to them (the model writes the subject and
    # may name the person); the client, the week and the delivery's id and time stay.
    personal_data=PersonalData(
        tools={
            "send_invoice_reminder": ("args.subject", "args.body", "result.to", "result.subject")
        },
    ),
    # The list, one step per client (a second try for a failed one), the closing line.
    max_steps=64,
    job=reminders_job,
)
