"""The on-call digest: read tonight's on-call handover, mail it to the on-call list once.

Reading the handover is read-only; the email is a side effect, so it goes through
nightshift's action protocol: its key (`oncall_digest:<date>:<team>`) is saved before the
first send, the mail service replays a repeated key for 24 hours, and after that nightshift
asks the service (lookup) instead of sending again.

Settings (a tool reads them with `context.config`): `oncall.web_url`, `oncall.email_url` and
the secret `oncall.email_token`, from NIGHTSHIFT_CONFIG_ONCALL_WEB_URL and friends, or from an
`[oncall]` table in the file named by NIGHTSHIFT_CONFIG_FILE.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
from pydantic import BaseModel, Field

from pipeline import (
    Agent,
    Conversation,
    LookupUnsupported,
    PersonalData,
    RunPlan,
    SideEffect,
    Slot,
    ToolContext,
    text,
    tool,
    tool_use,
)

TIMEOUT = httpx.Timeout(10.0, connect=5.0)


# -- reading: a read-only tool with a hand-written JSON Schema --------------------------------


@tool(
    description="Read one page of the ops web service (the on-call handover is `oncall`).",
    schema={
        "type": "object",
        "properties": {"source": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"}},
        "required": ["source"],
        "additionalProperties": False,
    },
    needs=("oncall.web_url",),  # a worker without it fails the run at once, reason `config`
)
def read_handover(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    base = context.config("oncall.web_url").rstrip("/")
    response = httpx.get(f"{base}/sources/{args['source']}", timeout=TIMEOUT)
    response.raise_for_status()  # 5xx and timeouts are retried, 4xx go back to the model
    page: dict[str, Any] = response.json()
    return page


# -- sending: a typed tool (its schema derived from Digest), a side effect ------------------


class Digest(BaseModel):
    to: str = Field(pattern=r"^[^@\s]+@[^@\s]+$")
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1)


def digest_key(digest: Digest, context: ToolContext) -> str:
    """One digest per team and night, whatever crashes in between (nightshift prefixes the
    agent's name: `oncall_digest:2026-11-29:ops`)."""
    return f"{context.run_input['date']}:{context.run_input['team']}"


def find_digest(key: str, digest: Digest, context: ToolContext) -> dict[str, Any] | None:
    """What the mail service sent under the key, if anything."""
    base = context.config("oncall.email_url").rstrip("/")
    response = httpx.get(f"{base}/emails", params={"key": key}, timeout=TIMEOUT)
    if response.status_code == 404:
        raise LookupUnsupported("this mail service cannot be asked about a key")
    response.raise_for_status()
    sent = response.json().get("deliveries") or []
    return dict(sent[0]) if sent else None


@tool(
    needs=("oncall.email_url",),
    side_effect=SideEffect(
        service="email",
        key=digest_key,
        honours_keys=True,
        key_retention=timedelta(hours=24),
        lookup=find_digest,
    ),
)
def mail_digest(digest: Digest, context: ToolContext) -> dict[str, Any]:
    """Mail the finished digest to the on-call list (once a night)."""
    base = context.config("oncall.email_url").rstrip("/")
    response = httpx.post(
        f"{base}/emails",
        json=digest.model_dump(),
        headers={
            "Idempotency-Key": context.idempotency_key or "",
            "Authorization": f"Bearer {context.config('oncall.email_token', 'none')}",
        },
        timeout=TIMEOUT,
    )
    response.raise_for_status()
    sent: dict[str, Any] = response.json()
    return sent


# -- the offline stand-in for the model -----------------------------------------------------


def script(conversation: Conversation) -> list[dict[str, Any]]:
    """What Claude would do, deterministically: read the handover, mail it, say so."""
    step = conversation.assistant_turns()
    results = conversation.tool_results()
    if step == 0:
        return [
            text("Reading the handover."),
            tool_use(step, 0, "read_handover", {"source": "oncall"}),
        ]
    if step == 1:
        handover = json.loads(results[0]["content"])
        run = conversation.input
        digest = {
            "to": run.get("to", f"oncall-{run['team']}@example.com"),
            "subject": f"On-call digest for {run['team']}, {run['date']}",
            "body": handover["body"],
        }
        return [tool_use(step, 0, "mail_digest", digest)]
    return [text(f"Mailed the digest: {results[-1]['content']}")]


# -- the schedule's job and the agent -------------------------------------------------------


def nightly(slot: Slot) -> RunPlan:
    """One digest per slot, dated the slot's local date."""
    return RunPlan({"team": slot.params["team"], "date": slot.date})


AGENT = Agent(
    name="oncall_digest",
    system="You write the on-call digest: short, factual, nothing invented.",
    instructions=(
        "Read the on-call handover with read_handover, then mail it to the on-call list with "
        "mail_digest, once."
    ),
    tools=(read_handover, mail_digest),
    input_schema={
        "type": "object",
        "properties": {
            "team": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"},
            "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
            "to": {"type": "string", "pattern": r"^[^@\s]+@[^@\s]+$"},
        },
        "required": ["team", "date"],
        "additionalProperties": False,
    },
    script=script,
    max_steps=6,
    job=nightly,
    # The on-call list's address and the handover's text (it names people): retention drops
    # them when it compacts a finished run, and keeps the rest of the outcome.
    personal_data=PersonalData(input=("to",), tools={"mail_digest": ("args.to", "args.body")}),
)
