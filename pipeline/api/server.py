"""The HTTP interface: a FastAPI app with the JSON API, signed webhooks, metrics and status page.

`create_app(ApiConfig.from_env())` builds it; `nightshift api` serves it with uvicorn.
Routes: pipeline/api/routes.py (JSON) and pipeline/api/pages.py (the status page).
Every error is `{"error": "<what went wrong>"}` with the matching 4xx/5xx status.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI

from pipeline.api import pages, routes, spec
from pipeline.api.base import ApiConfig, BodyLimit, SecurityHeaders, install_error_handlers
from pipeline.runs.start import code_version

log = logging.getLogger("nightshift.api")


def create_app(config: ApiConfig) -> FastAPI:
    app = FastAPI(
        title="nightshift",
        version=_version(),
        summary="Durable AI-agent runs: start and watch runs, decide approvals, take events.",
        redoc_url=None,
        docs_url=None,  # spec.install serves both, behind sign-in, with local assets
        openapi_url=None,
    )
    app.state.config = config
    install_error_handlers(app)
    app.include_router(routes.router)
    pages.install(app, config)
    spec.install(app)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    app.add_middleware(SecurityHeaders)
    if config.insecure_no_auth:
        log.warning("the API runs WITHOUT authentication (--insecure-no-auth)")
    return app


def _version() -> str:
    return code_version()
