"""Invoice reminders: every Monday, one reminder email per overdue invoice and ISO week.

One reminder per step, so a crash after the third email resumes at the fourth, and the key
`invoice_reminders:<invoice>:<iso-week>` makes a second run in the same week send nothing again.
The model names the invoice and writes the text; whom it goes to is the invoice's own record
at the billing service, so a page the model read cannot add or change a recipient.
"""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

import httpx

from pipeline import (
    Agent,
    Conversation,
    PermanentError,
    RunPlan,
    Slot,
    ToolContext,
    text,
    tool,
    tool_use,
)
from pipeline.agents.services import EMAIL, TIMEOUT, WEB, email_effect, send_email, service_url

MAX_TRIES = 2
"""Calls of one tool for one thing (the list, a client's reminder) before moving on."""

_INVOICE = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,59}$"
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
    base = service_url(context, "web_url", "NIGHTSHIFT_WEB_URL")
    response = httpx.get(f"{base}/invoices/overdue", timeout=TIMEOUT)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def reminder_key(args: dict[str, Any], context: ToolContext) -> str:
    """One reminder per invoice and ISO week, whichever run (or rerun) of the week sends it.
    The send checks the invoice against the billing service's record (same id, overdue)."""
    return f"{args['invoice']}:{iso_week(context.run_input['date'])}"


def invoice_record(context: ToolContext, invoice: str) -> dict[str, Any]:
    """The billing service's record of an overdue invoice; PermanentError if it has none, or
    the invoice is not overdue (paid meanwhile), or the record has no usable address."""
    base = service_url(context, "web_url", "NIGHTSHIFT_WEB_URL")
    response = httpx.get(f"{base}/invoices/{invoice}", timeout=TIMEOUT)
    if response.status_code == 404:
        raise PermanentError(f"no invoice {invoice!r} at the billing service; nothing was sent")
    response.raise_for_status()
    record: dict[str, Any] = response.json()
    if record.get("invoice") != invoice:
        raise PermanentError(f"the billing service has no invoice exactly named {invoice!r}")
    if record.get("status", "overdue") != "overdue":
        raise PermanentError(f"invoice {invoice} is {record['status']}, not overdue; not sent")
    if not _ADDRESS.match(str(record.get("email", ""))):
        raise PermanentError(f"invoice {invoice}'s record has no email address; not sent")
    return record


@tool(
    description=(
        "Email the client of one overdue invoice a payment reminder. It goes to the contact "
        "on the invoice's record at the billing service; you write the subject and the body."
    ),
    schema={
        "type": "object",
        "properties": {
            "invoice": {"type": "string", "pattern": _INVOICE},
            "subject": {"type": "string", "minLength": 1, "maxLength": 200},
            "body": {"type": "string", "minLength": 1, "maxLength": MAX_BODY},
        },
        "required": ["invoice", "subject", "body"],
        "additionalProperties": False,
    },
    side_effect=email_effect(reminder_key),
    needs=(WEB, EMAIL),
)
def send_invoice_reminder(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    record = invoice_record(context, args["invoice"])
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
    """Invoice -> whether each reminder call so far succeeded."""
    asked = _calls(conversation, "send_invoice_reminder")
    outcomes: dict[str, list[bool]] = {}
    for result in conversation.tool_results():
        args = asked.get(result["tool_use_id"])
        if args is not None:
            outcomes.setdefault(args["invoice"], []).append(not result.get("is_error"))
    return outcomes


def reminder(invoice: dict[str, Any], week: str) -> dict[str, Any]:
    amount = f"{float(invoice['amount']):,.2f} {invoice['currency']}"
    body = (
        f"Dear {invoice['name']},\n\n"
        f"our invoice {invoice['invoice']} for {amount} was due on {invoice['due_date']} and "
        "is still open. Please arrange payment, or reply if it has crossed with this email.\n\n"
        f"Kind regards,\nAccounts receivable ({week})"
    )
    return {
        "invoice": invoice["invoice"],
        "subject": f"Reminder: invoice {invoice['invoice']} ({amount}) is overdue",
        "body": body[:MAX_BODY],
    }


def script(conversation: Conversation) -> list[dict[str, Any]]:
    """The list once, then one reminder a step, then a closing line with what happened."""
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
    for invoice in invoices:
        tries = done.get(invoice["invoice"], [])
        if not any(tries) and len(tries) < MAX_TRIES:
            email = reminder(invoice, week)
            return [tool_use(step, 0, "send_invoice_reminder", email)]
    client = {invoice["invoice"]: invoice["client"] for invoice in invoices}
    sent = sorted(client.get(i, i) for i, tries in done.items() if any(tries))
    failed = sorted(client.get(i, i) for i, tries in done.items() if not any(tries))
    return [
        text(
            f"Invoice reminders for {week}: {len(sent)} sent ({', '.join(sent) or 'none'}); "
            f"{len(failed)} failed ({', '.join(failed) or 'none'})."
        )
    ]


AGENT = Agent(
    name="invoice_reminders",
    system="You chase overdue invoices politely: one short reminder per overdue invoice and week.",
    instructions=(
        "List the overdue invoices with list_overdue_invoices, then send each overdue invoice "
        "one reminder with send_invoice_reminder, one at a time. Finish with a line saying "
        "who was reminded and whose reminder failed."
    ),
    tools=(list_overdue_invoices, send_invoice_reminder),
    input_schema={
        "type": "object",
        "properties": {
            "date": {"type": "string", "format": "date", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
        },
        "required": ["date"],
        "additionalProperties": False,
    },
    script=script,
    # The list, one step per client (a second try for a failed one), the closing line.
    max_steps=64,
    job=reminders_job,
)
