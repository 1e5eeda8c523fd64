"""The competitor monitor: the nightly job fans out one child run per competitor (this agent),
each reading that competitor's prices; price_synthesis summarises them once all are done."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from pipeline import (
    Agent,
    BatchPlan,
    Conversation,
    Slot,
    ToolContext,
    http_deadline,
    text,
    tool,
    tool_use,
)
from pipeline.agents.services import SECONDS, WEB, read_json
from pipeline.errors import Unavailable
from pipeline.settings import get_settings

MAX_FETCHES = 3
"""A price page that keeps failing temporarily is tried this often; a 4xx only once."""
DEFAULT_TOKEN_CAP = 1_000_000
"""The batch's token cap when the schedule's params name none (`token_cap`)."""

_COMPETITOR_ID = "^[a-z0-9-]{1,40}$"
_CLIENT_ERROR = re.compile(r"HTTP 4\d\d")


# An agent's own error, derived from a public base as a user's package would.
class CompetitorListUnavailable(Unavailable):
    """The competitor list could not be read; the slot is retried at the next check."""


# -- the job --------------------------------------------------------------------------------


def monitor_job(slot: Slot) -> BatchPlan:
    """One batch per slot: a child run per competitor, price_synthesis once all are done."""
    listed = fetch_competitors()
    return BatchPlan(
        batch_id=slot.key,
        name="competitor_monitor",
        child_agent="competitor_monitor",
        child_inputs=[
            {"competitor": c["id"], "name": c["name"], "batch": slot.key} for c in listed
        ],
        synthesis_agent="price_synthesis",
        params={
            "schedule": slot.schedule,
            "slot": slot.instant.isoformat(),
            "competitors": len(listed),
        },
        token_cap=int(slot.params.get("token_cap", DEFAULT_TOKEN_CAP)),
        cost_cap_usd=slot.params.get("cost_cap_usd"),
        tool_call_cap=slot.params.get("tool_call_cap"),
    )


def fetch_competitors() -> list[dict[str, str]]:
    """The competitor list from the web service (NIGHTSHIFT_WEB_URL)."""
    base = get_settings().web_url
    if not base:
        raise CompetitorListUnavailable("NIGHTSHIFT_WEB_URL is not set: no competitor list")
    try:
        response = http_deadline.request("GET", f"{base.rstrip('/')}/competitors", SECONDS)
        response.raise_for_status()
        listed = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise CompetitorListUnavailable(f"the competitor list could not be read: {exc}") from None
    if not isinstance(listed, list) or not all(
        isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("name"), str)
        for c in listed
    ):
        raise CompetitorListUnavailable("the competitor list is not a list of {id, name}")
    return [{"id": c["id"], "name": c["name"]} for c in listed]


# -- the child agent ------------------------------------------------------------------------


@tool(
    description="Fetch one competitor's current prices (per SKU) from the web service.",
    schema={
        "type": "object",
        "properties": {"competitor": {"type": "string", "pattern": _COMPETITOR_ID}},
        "required": ["competitor"],
        "additionalProperties": False,
    },
    needs=(WEB,),
)
def fetch_competitor_prices(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return read_json(context, WEB, f"/competitors/{args['competitor']}/prices")


def script(conversation: Conversation) -> list[dict[str, Any]]:
    """Fetch the prices (again after a temporary failure), then report them as JSON."""
    competitor, name = conversation.input["competitor"], conversation.input["name"]
    results = conversation.tool_results()
    fetched = next((r for r in results if not r.get("is_error")), None)
    errors = [str(r["content"]) for r in results if r.get("is_error")]
    gave_up = len(errors) >= MAX_FETCHES or any(_CLIENT_ERROR.search(e) for e in errors)
    if fetched is None and not gave_up:
        step = conversation.assistant_turns()
        fetch = tool_use(step, 0, "fetch_competitor_prices", {"competitor": competitor})
        return [text(f"Reading the prices of {name}."), fetch]
    report: dict[str, Any] = {"competitor": competitor, "name": name}
    if fetched is None:
        report |= {"ok": False, "error": errors[-1][:300]}
    else:
        page = json.loads(fetched["content"])
        prices = {p["sku"]: p["price"] for p in page.get("prices", [])}
        report |= {"ok": True, "currency": page.get("currency"), "prices": prices}
        report["as_of"] = page.get("as_of")
    return [text(json.dumps(report, sort_keys=True))]


AGENT = Agent(
    name="competitor_monitor",
    system="You monitor one competitor's prices for the pricing team. Report facts as JSON.",
    instructions=(
        "Fetch the competitor's prices with fetch_competitor_prices. Then answer with one JSON "
        'object and nothing else: {"competitor", "name", "ok": true, "currency", "as_of", '
        '"prices": {sku: price}}, or {"competitor", "name", "ok": false, "error"} when the '
        "price page cannot be read (retry temporary failures, not 4xx answers)."
    ),
    tools=(fetch_competitor_prices,),
    input_schema={
        "type": "object",
        "properties": {
            "competitor": {"type": "string", "pattern": _COMPETITOR_ID},
            "name": {"type": "string", "minLength": 1, "maxLength": 200},
            "batch": {"type": "string", "maxLength": 200},
        },
        "required": ["competitor", "name"],
        "additionalProperties": False,
    },
    script=script,
    max_steps=8,
    max_tool_calls=12,
    job=monitor_job,
)
