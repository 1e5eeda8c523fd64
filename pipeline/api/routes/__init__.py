"""The JSON API's routes, one module per resource: `runs`, `artifacts` (a run's reports),
`batches`, `bulk` (operations by filter), `approvals` (the approval webhook), `event_sources`
(the event webhook), `operations` (/metrics, /healthz); `signed` is what the two webhooks
share. `router` holds them all, in the order the OpenAPI document lists."""

from fastapi import APIRouter

from pipeline.api.routes import (
    approvals,
    artifacts,
    batches,
    bulk,
    event_sources,
    operations,
    runs,
)

SIGNED = ("/approvals/", "/events/")
"""The signed webhooks' paths: each judges its request after the signature (routes/signed.py)."""

router = APIRouter()
router.include_router(approvals.router)
router.include_router(event_sources.router)
router.include_router(operations.router)
router.include_router(runs.authed)
router.include_router(artifacts.authed)
router.include_router(batches.authed)
router.include_router(bulk.authed)
