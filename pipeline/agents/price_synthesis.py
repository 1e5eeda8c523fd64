"""The competitor monitor's synthesis: one nightly price summary from every child's report
(failed competitors named), and price changes proposed for the pricing manager to approve."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pipeline import (
    Agent,
    Conversation,
    PermanentError,
    SideEffect,
    ToolContext,
    text,
    tool,
    tool_use,
)
from pipeline.agents.documents import document_tool
from pipeline.agents.services import PRICING, find_price_change, read_prices, set_price
from pipeline.settings import config_variable

MIN_QUOTES = 3
"""A SKU needs this many competitor prices before a change is proposed for it."""
THRESHOLD = 0.02
"""Propose matching the market median when our price is further than this from it."""

MAX_CHANGE = "pricing.max_change"
"""The deployment's bound on one change, as a share of our current price (NIGHTSHIFT_CONFIG_
PRICING_MAX_CHANGE); DEFAULT_MAX_CHANGE unless set."""
DEFAULT_MAX_CHANGE = "0.25"

_SKU = "^[A-Za-z0-9_.-]{1,64}$"
PRICING_APPROVER = "pricing@example.com"
"""Who approves price changes unless NIGHTSHIFT_APPROVERS_SET_PRICE names someone else."""


# -- tools ----------------------------------------------------------------------------------


@tool(
    description="Read our current prices for the given SKUs from the price book.",
    schema={
        "type": "object",
        "properties": {
            "skus": {
                "type": "array",
                "items": {"type": "string", "pattern": _SKU},
                "minItems": 1,
                "maxItems": 200,
            }
        },
        "required": ["skus"],
        "additionalProperties": False,
    },
    needs=(PRICING,),
)
def read_price_book(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return {"prices": read_prices(context, args["skus"])}


write_summary = document_tool(
    "write_summary",
    "summary",
    "Save the nightly price summary (markdown) as the run's summary artifact.",
)


def price_key(args: dict[str, Any], context: ToolContext) -> str:
    """One change per SKU and batch (night), however often it is proposed or approved:
    `price_synthesis:sku-2:<batch>`. The batch is the one whose synthesis the fan-out started as
    this run (context.batch_id), never the input's `batch`: a run started by hand, whatever
    batch and children its input names, proposes nothing under a night's key."""
    if context.batch_id is None:
        raise PermanentError(
            "refused: price changes are proposed only by a night's synthesis, which its batch "
            "starts; this run was started on its own; nothing was proposed"
        )
    return f"{args['sku']}:{context.batch_id}"


def run_skus(run_input: dict[str, Any]) -> list[str]:
    """The SKUs this run may propose prices for: those MIN_QUOTES or more of the competitor
    reports in its input quote (one hostile page cannot add a SKU)."""
    reports = competitor_reports(run_input["children"])
    return [m.sku for m in markets(reports) if m.quotes >= MIN_QUOTES]


def max_change(context: ToolContext) -> float:
    configured = context.config(MAX_CHANGE, DEFAULT_MAX_CHANGE)
    try:
        bound = float(configured)
    except ValueError:
        bound = math.nan
    if not 0 < bound < math.inf:
        raise PermanentError(
            f"{config_variable(MAX_CHANGE)} must be a share above 0 (0.25 is 25%), not "
            f"{configured!r}; nothing was proposed"
        )
    return bound


def check_price_change(args: dict[str, Any], context: ToolContext) -> None:
    """Before a change is recorded for approval: the SKU is one of this run's, in the price
    book's currency, and the price moves at most pricing.max_change from our current one."""
    sku, price, currency = args["sku"], float(args["price"]), args["currency"]
    allowed = run_skus(context.run_input)
    if sku not in allowed:
        shown = ", ".join(allowed[:10]) + (f" and {len(allowed) - 10} more" if allowed[10:] else "")
        raise PermanentError(
            f"refused: {sku} is not one of this run's SKUs (quoted by {MIN_QUOTES}+ of its "
            f"competitor reports: {shown or 'none'}); nothing was proposed"
        )
    bound = max_change(context)
    current = read_prices(context, [sku]).get(sku)
    if current is None:
        raise PermanentError(f"refused: {sku} is not in our price book; nothing was proposed")
    if currency != current["currency"]:
        raise PermanentError(
            f"refused: {sku} is priced in {current['currency']}, not {currency}; "
            "nothing was proposed"
        )
    ours = float(current["price"])
    if abs(price - ours) > bound * ours * (1 + 1e-9):
        moved = f"{(price - ours) / ours:+.1%}" if ours else "from zero"
        raise PermanentError(
            f"refused: {sku} from {ours:.2f} to {price:.2f} {currency} ({moved}) is more than "
            f"the {bound:.1%} one change may move a price ({config_variable(MAX_CHANGE)}); "
            "nothing was proposed"
        )


@tool(
    name="set_price",
    description=(
        "Set our price for one SKU. The pricing manager must approve each change first; "
        f"give the reason they will read. Only for a SKU that {MIN_QUOTES} or more of this "
        "run's competitor reports quote, in the price book's currency, and within the "
        f"deployment's bound of our current price ({float(DEFAULT_MAX_CHANGE):.0%} unless "
        "configured); anything else is refused."
    ),
    schema={
        "type": "object",
        "properties": {
            "sku": {"type": "string", "pattern": _SKU},
            "price": {"type": "number", "exclusiveMinimum": 0},
            "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "reason": {"type": "string", "minLength": 1, "maxLength": 500},
        },
        "required": ["sku", "price", "currency", "reason"],
        "additionalProperties": False,
    },
    # The pricing API replays a repeated Idempotency-Key forever, and can be asked about one.
    side_effect=SideEffect(
        service="pricing",
        key=price_key,
        honours_keys=True,
        key_retention=timedelta.max,
        lookup=find_price_change,
        check=check_price_change,
    ),
    requires_approval=True,
    needs=(PRICING,),
    # Only the pricing manager changes prices; a deployment names them on its workers with
    # NIGHTSHIFT_APPROVERS_SET_PRICE=pricing@acme.example (comma-separated for several).
    approvers=(PRICING_APPROVER,),
)
def set_our_price(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return set_price(context, args["sku"], args["price"], args["currency"])


# -- reading the children -------------------------------------------------------------------


@dataclass(frozen=True)
class CompetitorReport:
    competitor: str
    name: str
    prices: dict[str, float]
    currency: str | None
    problem: str | None
    """Why there are no prices: the child failed, or reported that the page failed."""


def competitor_reports(children: list[dict[str, Any]]) -> list[CompetitorReport]:
    """Each child's outcome as a report, ordered by competitor."""
    reports = [_report(child) for child in children]
    return sorted(reports, key=lambda r: r.competitor)


def _report(child: dict[str, Any]) -> CompetitorReport:
    item = child.get("item") or {}
    competitor, name = str(item.get("competitor", "?")), str(item.get("name", "?"))
    if child.get("status") != "succeeded":
        why = child.get("error") or "no error recorded"
        problem = f"the run {child.get('status')} ({child.get('reason')}): {why}"
        return CompetitorReport(competitor, name, {}, None, problem)
    report = _json_object(child.get("result") or "")
    if report is None:
        return CompetitorReport(competitor, name, {}, None, "no readable price report")
    if not report.get("ok"):
        problem = str(report.get("error") or "the price page could not be read")
        return CompetitorReport(competitor, name, {}, None, problem)
    prices = {
        str(sku): float(price)
        for sku, price in (report.get("prices") or {}).items()
        if isinstance(price, int | float) and not isinstance(price, bool)
    }
    return CompetitorReport(competitor, name, prices, report.get("currency"), None)


def _json_object(reply: str) -> dict[str, Any] | None:
    """The JSON object in a child's final text (a model may wrap it in a sentence)."""
    start, end = reply.find("{"), reply.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        found = json.loads(reply[start : end + 1])
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


@dataclass(frozen=True)
class Market:
    sku: str
    quotes: int
    lowest: float
    median: float
    highest: float


def markets(reports: list[CompetitorReport]) -> list[Market]:
    by_sku: dict[str, list[float]] = {}
    for report in reports:
        for sku, price in report.prices.items():
            by_sku.setdefault(sku, []).append(price)
    return [
        Market(sku, len(p), min(p), round(statistics.median(p), 2), max(p))
        for sku, p in sorted(by_sku.items())
    ]


def proposals(markets: list[Market], ours: dict[str, Any]) -> list[dict[str, Any]]:
    """set_price arguments: match the median where we are more than THRESHOLD away from it."""
    proposed = []
    for market in markets:
        current = ours.get(market.sku)
        if current is None or market.quotes < MIN_QUOTES:
            continue
        price = float(current["price"])
        if abs(market.median - price) <= THRESHOLD * price:
            continue
        reason = (
            f"{market.quotes} competitors quote {market.lowest:.2f}-{market.highest:.2f}, "
            f"median {market.median:.2f}; ours is {price:.2f}"
        )
        proposed.append(
            {
                "sku": market.sku,
                "price": market.median,
                "currency": current["currency"],
                "reason": reason,
            }
        )
    return proposed


def summary_body(
    reports: list[CompetitorReport],
    markets: list[Market],
    ours: dict[str, Any],
    changes: list[dict[str, Any]],
) -> str:
    failed = [r for r in reports if r.problem is not None]
    lines = [f"Competitors read: {len(reports) - len(failed)} of {len(reports)}.", ""]
    if markets:
        lines += [
            "| SKU | ours | lowest | median | highest | quotes |",
            "|---|---|---|---|---|---|",
        ]
        for m in markets:
            mine = ours.get(m.sku, {}).get("price")
            shown = f"{mine:.2f}" if isinstance(mine, int | float) else "-"
            lines.append(
                f"| {m.sku} | {shown} | {m.lowest:.2f} | {m.median:.2f} | {m.highest:.2f} "
                f"| {m.quotes} |"
            )
        lines.append("")
    lines.append(f"Failed competitors ({len(failed)}):" if failed else "Failed competitors: none.")
    lines += [f"- {r.name} ({r.competitor}): {r.problem}" for r in failed]
    lines.append("")
    if changes:
        lines.append("Proposed price changes (each waits for the pricing manager's approval):")
        lines += [
            f"- {c['sku']}: {c['price']:.2f} {c['currency']} ({c['reason']})" for c in changes
        ]
    else:
        lines.append("No price changes proposed.")
    return "\n".join(lines)


# -- the script -----------------------------------------------------------------------------


def _result_of(conversation: Conversation, name: str) -> dict[str, Any] | None:
    ids = {b["id"] for b in conversation.tool_uses() if b["name"] == name}
    for result in conversation.tool_results():
        if result["tool_use_id"] in ids and not result.get("is_error"):
            found = _json_object(str(result["content"]))
            return found if found is not None else {}
    return None


def script(conversation: Conversation) -> list[dict[str, Any]]:
    """Our prices, then the summary, then every proposal in one reply, then a closing line."""
    batch = conversation.input["batch"]
    step = conversation.assistant_turns()
    used = {b["name"] for b in conversation.tool_uses()}
    reports = competitor_reports(conversation.input["children"])
    market = markets(reports)
    if market and "read_price_book" not in used:
        skus = [m.sku for m in market]
        return [
            text("Reading our price book."),
            tool_use(step, 0, "read_price_book", {"skus": skus}),
        ]
    ours = (_result_of(conversation, "read_price_book") or {}).get("prices") or {}
    changes = proposals(market, ours)
    if "write_summary" not in used:
        title = f"Competitor prices, batch {batch}"
        body = summary_body(reports, market, ours, changes)
        return [tool_use(step, 0, "write_summary", {"title": title, "body": body})]
    if changes and "set_price" not in used:
        return [
            text(f"Proposing {len(changes)} price change(s) for approval."),
            *(tool_use(step, i, "set_price", change) for i, change in enumerate(changes)),
        ]
    failed = [f"{r.name} ({r.competitor})" for r in reports if r.problem is not None]
    outcomes = _outcomes(conversation)
    return [
        text(
            _partial_note(conversation.input.get("stopped"))
            + f"Nightly price summary for {batch} written. Failed competitors: "
            f"{', '.join(failed) or 'none'}. Price changes: {'; '.join(outcomes) or 'none'}."
        )
    ]


def _partial_note(stopped: dict[str, Any] | None) -> str:
    """A batch stopped by a budget: the summary says it is partial, what stopped and why."""
    if not stopped:
        return ""
    names = [str(item.get("name") or item.get("competitor")) for item in stopped["stopped"]]
    return (
        f"PARTIAL: the batch was stopped ({stopped['reason']}: {stopped.get('why') or 'no detail'}"
        f"); {stopped['finished']} competitor(s) finished, {len(names)} stopped: "
        f"{', '.join(names) or 'none'}. "
    )


def _outcomes(conversation: Conversation) -> list[str]:
    asked = {b["id"]: b["input"] for b in conversation.tool_uses() if b["name"] == "set_price"}
    outcomes = []
    for result in conversation.tool_results():
        change = asked.get(result["tool_use_id"])
        if change is None:
            continue
        content = str(result["content"])
        if result.get("is_error") or content.startswith("Not done"):
            outcomes.append(f"{change['sku']} not changed ({content[:120]})")
        else:
            outcomes.append(f"{change['sku']} set to {change['price']:.2f}")
    return outcomes


AGENT = Agent(
    name="price_synthesis",
    system=(
        "You are the pricing team's night analyst. Summarise competitor prices and propose "
        "price changes; a person approves every change."
    ),
    instructions=(
        "The input holds every competitor run's outcome. Read our prices with read_price_book, "
        "write the nightly summary with write_summary (a table per SKU, and every competitor "
        "that could not be read, by name), then propose each price change with set_price "
        "(match the competitor median where ours is more than 2% away, given 3 or more quotes)."
    ),
    tools=(read_price_book, write_summary, set_our_price),
    input_schema={
        "type": "object",
        "properties": {
            "batch": {"type": "string", "minLength": 1, "maxLength": 200},
            "children": {"type": "array", "items": {"type": "object"}, "maxItems": 2000},
            "stopped": {"type": "object"},
        },
        "required": ["batch", "children"],
        "additionalProperties": False,
    },
    script=script,
    max_steps=10,
)
