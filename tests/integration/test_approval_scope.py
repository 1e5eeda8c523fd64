"""Issue 31, against a live API (uvicorn on a socket): an approval through the webhook applies
only to the action the approver saw (its run and its arguments' hash, both required), and who
decided is told only to who may decide: not in a refusal, not on the action's page, not in the
run's event stream."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

import httpx
from sqlalchemy import update

from models import ActionState, Run, RunStatus
from pipeline.agents.price_synthesis import PRICING_APPROVER
from pipeline.db import transaction
from pipeline.engine.action_rows import arguments_hash, record_txn
from pipeline.engine.dispatch import NewAction
from pipeline.runs.start import create_run_txn
from tests.integration.api_fixtures import (
    action_row,
    as_seen,
    audit_trail,
    bearer,
    live_server,
    make_app,
    person_token,
    signed,
    submit_login,
)

NIGHT = "competitor-monitor:2026-11-30T07:00:00+00:00"
KEY = f"price_synthesis:sku-1:{NIGHT}"
QUOTES = [
    {"item": {"competitor": c, "name": f"Competitor {c}"}, "status": "succeeded",
     "reason": "completed", "error": None, "result": "{}"}
    for c in ("c01", "c02", "c03")
]  # fmt: skip


def price(amount: float) -> dict[str, Any]:
    return {"sku": "sku-1", "price": amount, "currency": "USD", "reason": "the market median"}


def park_proposal(amount: float, approvers: tuple[str, ...] = (PRICING_APPROVER,)) -> uuid.UUID:
    """A night's price synthesis waiting for the pricing manager to approve `amount` for
    sku-1, its action recorded (or the key taken over) as the engine records it."""
    with transaction() as session:
        run_id = create_run_txn(
            session, "price_synthesis", {"batch": NIGHT, "children": QUOTES}
        ).run_id
        session.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(status=RunStatus.WAITING, waiting_on=f"approval:{KEY}", step=1)
        )
        proposal = NewAction(
            key=KEY, run_id=run_id, tool_use_id="toolu_s001_0", tool="set_price",
            service="pricing", args=price(amount), requires_approval=True, approvers=approvers,
        )  # fmt: skip
        record_txn(session, proposal)
    return run_id


def decide(base: str, token: str, body: dict[str, Any]) -> httpx.Response:
    path = f"/approvals/{KEY}"
    return httpx.post(f"{base}{path}", timeout=10, **signed(path, body, token=token))


def test_a_held_approval_of_a_cancelled_runs_price_does_not_apply_to_the_next_run(
    db_url: str,
) -> None:
    pricing = person_token(PRICING_APPROVER)
    with live_server(make_app()) as base:
        # given the night's synthesis proposing 14.00 for sku-1, and approvals of it that the
        # pricing manager's integration signed but did not deliver (held: a queue, a proxy)
        first = park_proposal(14.0)
        saw = as_seen(KEY)
        held_bare = {"decision": "approve"}  # the old body: no run, no arguments
        held = {"decision": "approve", **saw}
        # when that run is cancelled, and another takes the key over, proposing 12.00
        cancelled = httpx.post(f"{base}/runs/{first}/cancel", headers=bearer(pricing), timeout=10)
        assert cancelled.json()["status"] == RunStatus.CANCELLED.value, cancelled.text
        assert action_row(KEY).state is ActionState.WITHDRAWN
        second = park_proposal(12.0)
        taken = action_row(KEY)
        assert (taken.run_id, taken.args["price"]) == (second, 12.0)

        # then the held approvals are delivered, and each is refused
        bare = decide(base, pricing, held_bare)
        stale = decide(base, pricing, held)
        other_args = decide(base, pricing, {**held, "run_id": str(second)})

        # a body that names neither the run nor the arguments is a 422 naming both, in a line
        assert bare.status_code == 422, bare.text
        error = bare.json()["error"]
        assert "'run_id'" in error and "'args_hash'" in error and "\n" not in error
        # the first run's approval is not the second run's, nor 14.00's hash 12.00's
        assert stale.status_code == 409 and "not the one you saw" in stale.json()["error"]
        assert other_args.status_code == 409, other_args.text
        # and 12.00 was not approved: nothing will set it until someone approves it as seen
        action = action_row(KEY)
        assert (action.state, action.decision, action.args["price"]) == (
            ActionState.PENDING_APPROVAL,
            None,
            12.0,
        )
        assert "approve" not in [entry.event for entry in audit_trail(KEY)]

        # and an approval of what the second run proposes, as seen, applies to it
        approved = decide(base, pricing, {"decision": "approve", **as_seen(KEY)})
        assert approved.status_code == 200, approved.text
        assert approved.json()["run_id"] == str(second)
        assert action_row(KEY).state is ActionState.INTENDED
    assert arguments_hash(price(12.0)) == action_row(KEY).args_hash


def test_who_decided_is_told_only_to_those_who_may_decide(db_url: str) -> None:
    # given a price change that the pricing manager or Carol may approve, approved by the
    # pricing manager, and Mallory, who may read runs but is no approver
    run_id = park_proposal(14.0, approvers=(PRICING_APPROVER, "carol@example.com"))
    pricing = person_token(PRICING_APPROVER)
    mallory = person_token("mallory@example.com")
    carol = person_token("carol@example.com")
    with live_server(make_app()) as base:
        seen = as_seen(KEY)
        assert decide(base, pricing, {"decision": "approve", **seen}).status_code == 200

        # when Mallory tries to reject it, or to approve it again
        rejected = decide(base, mallory, {"decision": "reject", **seen})
        repeated = decide(base, mallory, {"decision": "approve", **seen})
        # then both are refused as hers to make, and neither names the decider
        for answer in (rejected, repeated):
            assert answer.status_code == 403, answer.text
            assert "not among the approvers" in answer.json()["error"]
            assert PRICING_APPROVER not in answer.text

        # when Carol, an approver, rejects it: she is told who approved it first
        conflict = decide(base, carol, {"decision": "reject", **seen})
        assert conflict.status_code == 409
        assert f"already decided (approve by {PRICING_APPROVER})" in conflict.json()["error"]

        # when Mallory opens the action's page, and the run's event stream
        page = _page_as(base, mallory)
        stream = _events_until(base, mallory, run_id, '"decision":"approve"')
        # then she sees that it was approved, by an approver, and not by whom
        assert page.status_code == 200
        assert "approve by an approver" in page.text
        assert "<td>approve</td><td>an approver</td><td></td>" in page.text
        assert PRICING_APPROVER not in page.text
        assert '"state":"intended"' in stream
        assert PRICING_APPROVER not in stream
        # while the page names the decider to an approver, in the decision and its audit trail
        shown = _page_as(base, carol)
        assert f"approve by {PRICING_APPROVER}" in shown.text
        assert f"<td>approve</td><td>{PRICING_APPROVER}</td><td>approval webhook" in shown.text


def _page_as(base: str, token: str) -> httpx.Response:
    with httpx.Client(base_url=base, timeout=10) as browser:
        signed_in = submit_login(browser, {"token": token}, follow_redirects=False)
        assert signed_in.status_code == 303, signed_in.text
        return browser.get(f"/ui/actions/{quote(KEY, safe='')}")


def _events_until(base: str, token: str, run_id: uuid.UUID, wanted: str) -> str:
    """The run's event stream as `token` reads it, up to the event that carries `wanted` (the
    run was woken and no worker runs it: its stream stays open)."""
    read: list[str] = []
    url = f"{base}/runs/{run_id}/events"
    with httpx.stream("GET", url, headers=bearer(token), timeout=10) as stream:
        for line in stream.iter_lines():
            read.append(line)
            if wanted in line:
                return "\n".join(read)
    raise AssertionError(f"the stream ended without {wanted}: {read}")
