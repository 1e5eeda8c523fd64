"""POST /events/{source}: another service's signed event, which starts its source's run once."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from pipeline.api.bodies import EventDelivery
from pipeline.api.guards import config_of
from pipeline.api.routes.signed import openapi_extra, signed_body
from pipeline.runs.external_events import start_from_event

router = APIRouter()
_EVENT_SECRET = "NIGHTSHIFT_EVENT_WEBHOOK_SECRET"


@router.post(
    "/events/{source}",
    tags=["webhooks"],
    openapi_extra=openapi_extra(EventDelivery, _EVENT_SECRET, bearer_too=False),
)
async def event(source: str, request: Request) -> JSONResponse:
    """Start the source's run for this event once; a repeated event id returns its run (200)."""

    secret = config_of(request).event_webhook_secret
    body: EventDelivery = await signed_body(request, EventDelivery, secret, _EVENT_SECRET)
    started = await run_in_threadpool(start_from_event, source, body.event_id, body.payload)
    return JSONResponse(
        {
            "run_id": str(started.run_id),
            "duplicate": started.duplicate,
            "deliveries": started.deliveries,
        },
        status_code=200 if started.duplicate else 201,
    )
