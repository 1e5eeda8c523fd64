"""/bulk: cancel, retry, approve or reject by filter. A dry run unless `dry_run` is false; then
one audited operation a worker carries out, whose progress `GET /bulk/{operation_id}` shows."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from fastapi.concurrency import run_in_threadpool

from pipeline.api.bodies import BulkAnswer, BulkRequest, failures
from pipeline.api.guards import Caller, require_caller
from pipeline.errors import NothingMatched
from pipeline.runs import bulk
from pipeline.runs.bulk_filter import BulkFilter
from pipeline.runs.decisions import Actor
from pipeline.views.bulk import bulk_operation, parse_operation_id, recent_bulk_operations

authed = APIRouter(dependencies=[Depends(require_caller)])


@authed.post(
    "/bulk",
    response_model=BulkAnswer,
    tags=["bulk"],
    responses={
        201: {"model": BulkAnswer, "description": "The operation was made."},
        **failures(401, 422),
    },
)
async def bulk_action(body: BulkRequest, who: Caller, response: Response) -> BulkAnswer:
    """What a filter matches (the dry run, by default: nothing changes), or, with `dry_run`
    false, one operation on all of it: recorded with the caller, the filter and the matched
    ids, then applied by a worker item by item, each exactly as its single action (cancel,
    retry, an approver's decision); a worker's death halfway leaves the rest to another, none
    done twice. Nothing matched: no operation (200, count 0)."""
    wanted = BulkFilter.parse(body.filter.given())
    if body.dry_run:
        found = await run_in_threadpool(bulk.preview, body.kind, wanted)
        return BulkAnswer(**found.as_json(), dry_run=True)
    actor = Actor(who.actor.identity, f"api, {who.actor.via}")
    try:
        created = await run_in_threadpool(bulk.create, body.kind, wanted, actor, body.note)
    except NothingMatched:
        return BulkAnswer(**bulk.Preview(body.kind, wanted, []).as_json(), dry_run=False)
    response.status_code = 201
    response.headers["Location"] = f"/bulk/{created.operation_id}"
    return BulkAnswer(**created.as_json(), dry_run=False)


@authed.get("/bulk", tags=["bulk"])
def bulk_operations(limit: Annotated[int, Query(ge=1, le=200)] = 20) -> dict[str, Any]:
    """Bulk operations, newest first, with their progress."""
    return {"operations": recent_bulk_operations(limit)}


@authed.get("/bulk/{operation_id}", tags=["bulk"], responses=failures(401, 404, 422))
def bulk_progress(operation_id: str) -> dict[str, Any]:
    """An operation: who asked, when, the filter, its kind, and its progress (items done of
    all, by outcome: done, already, refused) with each item's outcome (up to 500)."""
    return bulk_operation(parse_operation_id(operation_id))
