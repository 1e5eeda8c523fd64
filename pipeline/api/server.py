"""The HTTP interface: a FastAPI app with the JSON API, signed webhooks, metrics and status page.

`create_app(ApiConfig.from_env())` builds it; `nightshift api` serves it with uvicorn, configured
by `server_config`.
Routes: pipeline/api/routes/ (JSON, a module per resource; bodies in pipeline/api/bodies.py) and
pipeline/api/pages/ (the status page, a module per page).
Every error is `{"error": "<what went wrong>"}` with the matching 4xx/5xx status.
"""

from __future__ import annotations

import logging
from typing import Any

import uvicorn
from fastapi import FastAPI

import pipeline.tracing as tracing
from pipeline.api import pages, routes, spec
from pipeline.api.base import ApiConfig, install_error_handlers
from pipeline.api.middleware import BodyGuard, LocalOnly, ProxiedSameSite, SecurityHeaders
from pipeline.logs import safe_log_lines
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
    safe_log_lines()
    tracing.configure()  # spans as the OTEL_* variables say, or none
    install_error_handlers(app)
    app.include_router(routes.router)
    pages.install(app, config)
    spec.install(app)
    app.add_middleware(
        BodyGuard,
        limit=config.max_body_bytes,
        seconds=config.body_seconds,
        anonymous=config.anonymous_uploads,
        signed=routes.SIGNED,
        identity_header=config.identity_header,
    )
    # Outside the guard: a foreign request is refused unread.
    if config.identity_header is not None:
        app.add_middleware(ProxiedSameSite, identity_header=config.identity_header)
    if config.insecure_no_auth:
        app.add_middleware(LocalOnly)
        log.warning("the API runs WITHOUT authentication (--insecure-no-auth)")
    app.add_middleware(SecurityHeaders)
    return app


def server_config(app: FastAPI, host: str, port: int, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for `app`: X-Forwarded-For and -Proto are believed only from the
    proxies the operator listed (NIGHTSHIFT_FORWARDED_ALLOW_IPS), never by default. uvicorn's
    own default trusts 127.0.0.1, so any local client could pass for a listed identity proxy."""
    config: ApiConfig = app.state.config
    forwarded = sorted(config.forwarded_allow_ips)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        proxy_headers=bool(forwarded),
        forwarded_allow_ips=forwarded or None,
        server_header=False,
        **options,
    )


def _version() -> str:
    return code_version()
