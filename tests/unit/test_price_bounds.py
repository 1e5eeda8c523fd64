"""What set_price may propose: a SKU this run's competitor reports quote, in the price book's
currency, within pricing.max_change of our current price. Checked before anything is recorded."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import PermanentError, ToolContext
from pipeline.agents.price_synthesis import check_price_change, run_skus, set_our_price
from pipeline.sandbox import PricingSandbox
from pipeline.settings import Settings

NIGHT = "competitor-monitor:2026-11-30T07:00:00+00:00"


def child(competitor: str, prices: dict[str, float], ok: bool = True) -> dict[str, Any]:
    report = {"ok": ok, "currency": "USD", "prices": prices}
    return {
        "item": {"competitor": competitor, "name": competitor.upper()},
        "status": "succeeded",
        "result": json.dumps(report),
    }


# sku-2 and sku-3 are quoted three times; sku-1 only by one (possibly hostile) page.
RUN_INPUT = {
    "batch": NIGHT,
    "children": [
        child("c01", {"sku-1": 5.0, "sku-2": 51.0, "sku-3": 120.0}),
        child("c02", {"sku-2": 52.0, "sku-3": 125.0}),
        child("c03", {"sku-2": 53.5, "sku-3": 127.0}),
    ],
}


@pytest.fixture
def pricing(tmp_path: Path) -> Iterator[PricingSandbox]:
    with PricingSandbox(log_path=tmp_path / "pricing.jsonl") as sandbox:
        yield sandbox


def context(pricing: PricingSandbox, **env: str) -> ToolContext:
    settings = Settings.from_env(
        {
            "NIGHTSHIFT_DATA_DIR": "/tmp/nightshift-unit",
            "NIGHTSHIFT_PRICING_URL": pricing.url,
            **env,
        }
    )
    return ToolContext(uuid.uuid4(), "price_synthesis", "toolu_1", settings, RUN_INPUT)


def change(sku: str, price: float, currency: str = "USD") -> dict[str, Any]:
    return {"sku": sku, "price": price, "currency": currency, "reason": "match the market"}


def test_the_runs_skus_are_those_three_reports_quote() -> None:
    assert run_skus(RUN_INPUT) == ["sku-2", "sku-3"]
    assert run_skus({"batch": NIGHT, "children": []}) == []


def test_a_change_within_the_bound_for_a_sku_of_the_run_passes(pricing: PricingSandbox) -> None:
    check_price_change(change("sku-2", 52.0), context(pricing))  # ours 49.00: +6%
    check_price_change(change("sku-2", 49.0 * 1.25), context(pricing))  # exactly the bound
    check_price_change(change("sku-3", 129.0 * 0.75), context(pricing))


@pytest.mark.parametrize(
    ("proposed", "refusal"),
    [
        (change("sku-1", 6.0), "sku-1 is not one of this run's SKUs (quoted by 3+ of its "
                               "competitor reports: sku-2, sku-3)"),
        (change("sku-9", 6.0), "sku-9 is not one of this run's SKUs"),
        (change("sku-3", 1290.0), "sku-3 from 129.00 to 1290.00 USD (+900.0%) is more than the "
                                  "25.0% one change may move a price"),
        (change("sku-2", 12.0), "sku-2 from 49.00 to 12.00 USD (-75.5%)"),
        (change("sku-2", 52.0, "EUR"), "sku-2 is priced in USD, not EUR"),
    ],
)  # fmt: skip
def test_a_change_outside_the_run_or_the_bound_is_refused_in_one_line(
    pricing: PricingSandbox, proposed: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(PermanentError) as refused:
        check_price_change(proposed, context(pricing))
    message = str(refused.value)
    assert message.startswith("refused: ") and refusal in message, message
    assert message.endswith("nothing was proposed") and "\n" not in message
    assert pricing.changes() == []


def test_the_deployment_sets_the_bound_and_a_malformed_one_refuses_everything(
    pricing: PricingSandbox,
) -> None:
    wide = context(pricing, NIGHTSHIFT_CONFIG_PRICING_MAX_CHANGE="10")
    check_price_change(change("sku-3", 1290.0), wide)
    tight = context(pricing, NIGHTSHIFT_CONFIG_PRICING_MAX_CHANGE="0.05")
    with pytest.raises(PermanentError, match=r"\(\+6\.1%\) is more than the 5\.0% one change"):
        check_price_change(change("sku-2", 52.0), tight)
    for bad in ("0", "-0.1", "lots", "nan", "inf"):
        broken = context(pricing, NIGHTSHIFT_CONFIG_PRICING_MAX_CHANGE=bad)
        with pytest.raises(PermanentError, match="NIGHTSHIFT_CONFIG_PRICING_MAX_CHANGE must be"):
            check_price_change(change("sku-2", 52.0), broken)


def test_set_price_declares_the_check_so_the_engine_asks_it_before_recording() -> None:
    assert set_our_price.side_effect is not None
    assert set_our_price.side_effect.check is check_price_change
    assert set_our_price.requires_approval
