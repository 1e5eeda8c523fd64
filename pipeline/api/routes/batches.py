"""/batches: a batch, and its runs' progress as one stream of Server-Sent Events."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from pipeline.api import sse
from pipeline.api.bodies import failures
from pipeline.api.guards import Caller, require_caller
from pipeline.api.tokens import still_valid
from pipeline.views.batches import show_batch
from pipeline.views.feed import Subject

authed = APIRouter(dependencies=[Depends(require_caller)])


@authed.get(
    "/batches/{batch_id:path}/events",
    tags=["batches"],
    response_class=StreamingResponse,
    responses={**sse.OPENAPI_STREAM, **failures(401, 404, 422)},
)
async def batch_events(
    batch_id: str,
    who: Caller,
    last_event_id: sse.LastEventId = None,
    after: sse.After = None,
) -> StreamingResponse:
    """Every run of the batch (children and synthesis) and the batch's own status changes
    (batch_changed), as Server-Sent Events, in one order; `end` once all are finished."""
    subject = Subject(batch_id=batch_id)
    return await sse.event_stream(subject, last_event_id, lambda: still_valid(who), after=after)


@authed.get("/batches/{batch_id:path}", tags=["batches"])
def batch(batch_id: str) -> dict[str, Any]:
    """A batch: its status, its children counted by status, its synthesis run and the
    approvals it waits for."""

    return show_batch(batch_id).as_json()
