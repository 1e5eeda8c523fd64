"""POST /approvals/{action_key}: an approver's signed decision on a pending action."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from pipeline.api import webhooks
from pipeline.api.bodies import ApprovalDecision
from pipeline.api.guards import Caller, config_of
from pipeline.api.routes.signed import openapi_extra, signed_body
from pipeline.runs.decisions import Actor, Seen, decide

router = APIRouter()
_APPROVAL_SECRET = "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET"


@router.post(
    "/approvals/{action_key:path}",
    tags=["webhooks"],
    openapi_extra=openapi_extra(ApprovalDecision, _APPROVAL_SECRET, bearer_too=True),
)
async def approval(action_key: str, request: Request, who: Caller) -> dict[str, Any]:
    """Approve or reject a pending action, once, as whom the bearer token speaks for: a
    repeated identical decision returns the first outcome with "first": false; a different
    one is refused (409); someone not among the tool's approvers gets 403."""
    secret = config_of(request).approval_webhook_secret
    body: ApprovalDecision = await signed_body(
        request, ApprovalDecision, secret, _APPROVAL_SECRET, webhooks.credential_of(who)
    )
    actor = Actor(who.actor.identity, f"approval webhook, {who.actor.via}")
    seen = Seen(body.run_id, body.args_hash)
    result = await run_in_threadpool(decide, action_key, body.decision, actor, body.note, seen)
    return {
        "action_key": result.action_key,
        "decision": result.decision.value,
        "decided_by": result.decided_by,
        "first": result.first,
        "state": result.state.value,
        "run_id": str(result.run_id),
    }
