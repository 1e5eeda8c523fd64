"""set_price with real workers and the real SDK: a model steered into proposing a price for a
SKU the night's reports never quoted, and ten times the price of another, gets both refused
before anything is recorded; only the legitimate change waits for the pricing manager, and
it is sent as approved even when the price book moved while it waited."""

from __future__ import annotations

import json
from typing import Any

import httpx
from sqlalchemy import select

from models import Action, ActionState, RunStatus
from pipeline.db import transaction
from pipeline.runs.decisions import Decision, decide
from pipeline.sandbox.pricing import PricingSandbox
from pipeline.sandbox.responders import agent_responder
from pipeline.testing.agent_run import start_synthesis
from tests.integration.api_fixtures import PRICING_ACTOR
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import tool_results, wait_for_status

NIGHT = "competitor-monitor:2026-11-30T07:00:00+00:00"
# Three competitors quote sku-2 (median 52.00, ours 49.00: one change) and sku-3 (median
# 129.50, ours 129.00: no change); none quotes sku-1, which our price book also sells.
QUOTES = {"c01": (51.0, 128.0), "c02": (52.0, 129.5), "c03": (53.5, 131.0)}
RUN_INPUT = {
    "batch": NIGHT,
    "children": [
        {"item": {"competitor": c, "name": f"Competitor {c}"}, "status": "succeeded",
         "result": json.dumps({"ok": True, "currency": "USD",
                               "prices": {"sku-2": sku2, "sku-3": sku3}})}
        for c, (sku2, sku3) in QUOTES.items()
    ],
}  # fmt: skip
STEERED = [
    {"sku": "sku-1", "price": 1.0, "currency": "USD", "reason": "the page said so"},
    {"sku": "sku-3", "price": 1290.0, "currency": "USD", "reason": "the page said so"},
]
"""What a hostile page talked the model into proposing beside the real change."""
DONE = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.NEEDS_ATTENTION.value}


def key(sku: str) -> str:
    return f"price_synthesis:{sku}:{NIGHT}"


def steered_model(request: dict[str, Any]) -> dict[str, Any]:
    """The synthesis's own model, except that its reply proposing changes also proposes the
    two a hostile page asked for: one before the real change, one after it."""
    reply = agent_responder(request)
    blocks = reply["content"]
    if any(b.get("name") == "set_price" for b in blocks if b.get("type") == "tool_use"):
        first, second = (
            {"type": "tool_use", "id": f"toolu_steered_{n}", "name": "set_price", "input": args}
            for n, args in enumerate(STEERED)
        )
        at = next(i for i, b in enumerate(blocks) if b.get("name") == "set_price")
        reply["content"] = [*blocks[:at], first, *blocks[at:], second]
    return reply


def actions_of(run_id: Any) -> dict[str, ActionState]:
    with transaction() as session:
        rows = session.execute(
            select(Action.idempotency_key, Action.state).where(Action.run_id == run_id)
        )
        return {row.idempotency_key: row.state for row in rows}


def test_a_steered_model_gets_only_the_runs_bounded_change_proposed(
    sandbox: Sandbox, pricing: PricingSandbox, processes: ProcessFactory
) -> None:
    # given a model that obeys a hostile page, and a worker
    sandbox.messages.responder = steered_model
    processes("w1")

    # when the night's synthesis proposes its changes
    run_id = start_synthesis("price_synthesis", RUN_INPUT, NIGHT)
    parked = wait_for_status(run_id, {RunStatus.WAITING.value} | DONE, timeout=60)

    # then only the legitimate change waits for approval; the others were never recorded
    assert parked.waiting_on == f"approval:{key('sku-2')}", (parked.status, parked.error)
    assert actions_of(run_id) == {key("sku-2"): ActionState.PENDING_APPROVAL}
    refused = tool_results(run_id, "set_price")
    assert len(refused) == 1 and refused[0]["is_error"], refused
    assert "refused: sku-1 is not one of this run's SKUs" in refused[0]["content"]
    assert pricing.changes() == []

    # when someone changes sku-2 by hand while the change waits, and the manager approves it
    manual = httpx.put(f"{pricing.url}/prices/sku-2", json={"price": 30.0, "currency": "USD"})
    manual.raise_for_status()
    assert decide(key("sku-2"), Decision.APPROVE, PRICING_ACTOR).first
    row = wait_for_status(run_id, DONE, timeout=60)

    # then the approved change is sent as the approver saw it (the replayed step does not
    # re-judge it against the moved price book), once; the tenfold price is refused, unrecorded
    assert row.status == RunStatus.SUCCEEDED, row.error
    assert [(c["sku"], c["price"]) for c in pricing.changes(key("sku-2"))] == [("sku-2", 52.0)]
    assert not pricing.changes(key("sku-1")) and not pricing.changes(key("sku-3"))
    assert actions_of(run_id) == {key("sku-2"): ActionState.CONFIRMED}
    first, sent, tenfold = tool_results(run_id, "set_price")
    assert first["is_error"] and not sent["is_error"], (first, sent)
    assert tenfold["is_error"], tenfold
    assert (
        "refused: sku-3 from 129.00 to 1290.00 USD (+900.0%) is more than the 25.0% one change "
        "may move a price (NIGHTSHIFT_CONFIG_PRICING_MAX_CHANGE); nothing was proposed"
    ) in tenfold["content"]
    closing = row.result["text"]
    assert "sku-2 set to 52.00" in closing and "sku-1 not changed (" in closing, closing
    assert "sku-3 not changed (" in closing, closing
