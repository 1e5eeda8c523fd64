"""Who a request speaks for: the bearer token as a FastAPI dependency (401 with a challenge when
it proves no one), and the metrics scraper's token."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from pipeline.api.auth import caller
from pipeline.api.base import ApiConfig
from pipeline.api.tokens import Authenticated
from pipeline.errors import Unauthenticated

bearer = HTTPBearer(
    auto_error=False,
    description="A person's token (`nightshift tokens create --for ...`) or NIGHTSHIFT_API_TOKEN.",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


# An HTTP edge's own error (only these guards raise it), so it stays beside them.
class BearerRequired(Unauthenticated):
    """A valid bearer token is required."""

    scheme = "Bearer"


def config_of(request: Request) -> ApiConfig:
    config: ApiConfig = request.app.state.config
    return config


def require_caller(request: Request, credentials: Credentials) -> Authenticated:
    """Who the request speaks for (401 if it proves no one); routes record this identity."""
    client = request.client.host if request.client else None
    given = credentials.credentials if credentials else None
    found = caller(config_of(request), request.headers, client, given)
    if found is None:
        raise BearerRequired(
            "a valid bearer token is required (your own from `nightshift tokens create`, or "
            "NIGHTSHIFT_API_TOKEN)"
        )
    return found


Caller = Annotated[Authenticated, Depends(require_caller)]


def require_metrics_token(request: Request, credentials: Credentials) -> None:
    config = config_of(request)
    if config.insecure_no_auth:
        return
    if not config.metrics_token_matches(credentials.credentials if credentials else None):
        raise BearerRequired(
            "a valid bearer token is required (NIGHTSHIFT_API_TOKEN or NIGHTSHIFT_METRICS_TOKEN)"
        )
