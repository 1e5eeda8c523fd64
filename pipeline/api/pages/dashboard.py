"""The front page (what waits for a person, alerts, batches, bulk operations and runs) and the
attention page (only what waits for a person)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from models import ActionState, RunStatus
from pipeline.api.pages.base import current_session, render, to_login
from pipeline.views.actions import list_actions
from pipeline.views.alerts import list_alerts
from pipeline.views.batches import list_batches
from pipeline.views.bulk import recent_bulk_operations
from pipeline.views.liveness import queue_liveness
from pipeline.views.runs import list_runs

router = APIRouter(include_in_schema=False)


def _to_decide(limit: int) -> dict[str, Any]:
    """What waits for a person, as the dashboard and the attention page list it: approvals,
    and sends whose outcome nobody knows."""
    return {
        "approvals": list_actions(state=ActionState.PENDING_APPROVAL, limit=limit),
        "unknown": list_actions(state=ActionState.OUTCOME_UNKNOWN, limit=limit),
    }


@router.get("/ui")
def dashboard(request: Request, status: str | None = None) -> Response:
    session = current_session(request)
    if session is None:
        return to_login()
    chosen = status if status in {s.value for s in RunStatus} else None
    return render(
        request,
        "dashboard.html",
        session,
        **_to_decide(limit=100),
        alerts=list_alerts(limit=10),
        batches=[b.as_json() for b in list_batches(limit=20)],
        bulk=recent_bulk_operations(limit=10),
        runs=list_runs(status=chosen, limit=50),
        chosen=chosen,
        no_worker=queue_liveness().no_worker(),
    )


@router.get("/ui/attention")
def attention_page(request: Request) -> Response:
    """What a person must decide: approvals, and sends whose outcome nobody knows."""
    session = current_session(request)
    if session is None:
        return to_login()
    return render(
        request,
        "attention.html",
        session,
        **_to_decide(limit=200),
    )
