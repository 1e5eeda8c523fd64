"""Issue 31, against a live API (uvicorn on a socket) and real workers: an action key's scope is
the runtime's, not the caller's or the model's. A run started by anyone, or a hostile model,
cannot take the key of another run's side effect, make that run park, or ride on its approval."""

from __future__ import annotations

import json
import uuid

import httpx
from sqlalchemy import select

from models import Action, ActionState, Batch, Run, RunStatus
from pipeline.agent_definition import BatchPlan
from pipeline.agents.price_synthesis import PRICING_APPROVER
from pipeline.db import transaction
from pipeline.runs.fanout import create_batch_txn, ready_batches_txn
from pipeline.sandbox.pricing import PricingSandbox
from pipeline.sandbox.web import competitors
from tests.integration.api_fixtures import (
    action_row,
    as_seen,
    bearer,
    count,
    live_server,
    make_app,
    person_token,
    signed,
    start_as,
)
from tests.integration.conftest import ProcessFactory
from tests.support import run_row, wait_for, wait_for_status

PARKED = {RunStatus.WAITING.value, RunStatus.NEEDS_ATTENTION.value}
ENDED = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value}


# -- a night's price synthesis: its batch is the one the fan-out recorded --------------------

NIGHT = "competitor-monitor:2026-11-30T07:00:00+00:00"
MADE_UP = [
    {"item": {"competitor": c, "name": f"Made-up {c}"}, "status": "succeeded",
     "reason": "completed", "error": None,
     "result": json.dumps({"ok": True, "currency": "USD", "prices": {"sku-2": 40.0}})}
    for c in ("x01", "x02", "x03")
]  # fmt: skip
"""Children nobody ran, all quoting sku-2 at 40.00 (ours is 49.00: within the 25% bound)."""


def price_key(sku: str) -> str:
    return f"price_synthesis:{sku}:{NIGHT}"


def _night_of(children: int) -> BatchPlan:
    listed = competitors(children)
    return BatchPlan(
        batch_id=NIGHT, name="competitor_monitor", child_agent="competitor_monitor",
        child_inputs=[{"competitor": c["id"], "name": c["name"], "batch": NIGHT} for c in listed],
        synthesis_agent="price_synthesis", params={},
    )  # fmt: skip


def start_the_night() -> None:
    """Tonight's competitor monitor as its schedule starts it: three competitors (the web
    sandbox's c01-c03, whose median moves sku-1 and sku-2), then the synthesis, once."""
    with transaction() as session:
        assert create_batch_txn(session, _night_of(children=3))


def synthesis_of_the_night() -> uuid.UUID | None:
    with transaction() as session:
        return session.scalar(select(Batch.synthesis_run_id).where(Batch.id == NIGHT))


def keys_of(run_id: uuid.UUID) -> dict[str, ActionState]:
    with transaction() as session:
        rows = session.execute(
            select(Action.idempotency_key, Action.state).where(Action.run_id == run_id)
        )
        return {row.idempotency_key: row.state for row in rows}


def test_a_run_started_with_a_nights_batch_cannot_take_the_nights_price_changes(
    pricing: PricingSandbox, processes: ProcessFactory
) -> None:
    processes("w1")
    pricer = person_token(PRICING_APPROVER)
    with live_server(make_app()) as base:
        # given a synthesis started by someone's token with tonight's batch and made-up
        # children quoting sku-2 at 40.00
        squatter = start_as(
            base, person_token("mallory@example.com"), "price_synthesis",
            {"batch": NIGHT, "children": MADE_UP},
        )  # fmt: skip
        squatted = wait_for_status(squatter, PARKED | ENDED, timeout=60)
        # when tonight's batch runs and its synthesis proposes its changes
        start_the_night()
        real = wait_for(synthesis_of_the_night, timeout=90, what="the night's synthesis")
        parked = wait_for_status(real, PARKED | ENDED, timeout=60)

        # then the made-up run proposed nothing: its key would not be the night's, and it
        # holds none
        assert squatted.status is RunStatus.SUCCEEDED, squatted.error
        assert "proposed only by a night's synthesis" in str(run_row(squatter).result)
        assert keys_of(squatter) == {}
        # and the night's synthesis did not park on a conflict: it waits for its own changes
        assert (parked.status, parked.stop_reason) == (RunStatus.WAITING, None), parked.error
        assert keys_of(real) == {
            price_key("sku-1"): ActionState.PENDING_APPROVAL,
            price_key("sku-2"): ActionState.PENDING_APPROVAL,
        }
        assert action_row(price_key("sku-2")).args["price"] == 47.03

        # when the pricing manager approves what they see, as they see it
        for sku in ("sku-1", "sku-2"):
            key, path = price_key(sku), f"/approvals/{price_key(sku)}"
            body = {"decision": "approve", **as_seen(key)}
            approved = httpx.post(f"{base}{path}", timeout=10, **signed(path, body, token=pricer))
            assert approved.status_code == 200, approved.text
            assert approved.json()["run_id"] == str(real)
        done = wait_for_status(real, ENDED, timeout=60)

    # then the price book has the night's prices, each set once, and the summary says so
    assert done.status is RunStatus.SUCCEEDED, done.error
    assert [c["price"] for c in pricing.changes(price_key("sku-2"))] == [47.03]
    assert pricing.price("sku-2")["price"] == 47.03  # type: ignore[index]
    assert "sku-2 set to 47.03" in done.result["text"]


def test_a_caller_cannot_take_a_run_key_that_nightshift_starts_runs_under(db_url: str) -> None:
    token = person_token("mallory@example.com")
    body = {"agent": "price_synthesis", "input": {"batch": NIGHT, "children": MADE_UP}}
    taken = [f"{NIGHT}:synthesis", f"{NIGHT}:child:0", NIGHT, "event:github:42",
             f"retry-of:{uuid.uuid4()}"]  # fmt: skip
    with live_server(make_app()) as base:
        # when someone's token starts a run under a key of each form nightshift starts runs
        # under: tonight's synthesis, a child, the slot, an event, a retry
        answers = [
            httpx.post(f"{base}/runs", json=body, headers={**bearer(token), "Idempotency-Key": k})
            for k in taken
        ]
    # then each is refused in one line saying whose form it is, and no run is started
    for key, answer in zip(taken, answers, strict=True):
        assert answer.status_code == 422, (key, answer.text)
        error = answer.json()["error"]
        assert key in error and "own" in error and "\n" not in error
    assert count(Run) == 0
    # and the night's synthesis, once its (here childless) batch is done, starts under its key
    with transaction() as session:
        assert create_batch_txn(session, _night_of(children=0)) == []
        (started,) = ready_batches_txn(session)
    assert run_row(started).idempotency_key == f"{NIGHT}:synthesis"
