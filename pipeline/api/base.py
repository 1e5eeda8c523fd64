"""What every HTTP route shares: the API's settings, and errors as `{"error": ...}` with their
status, which comes from one table of error bases (`_STATUS_FOR`)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline.errors import (
    Conflict,
    Failed,
    Gone,
    Invalid,
    Malformed,
    Misconfigured,
    NightshiftError,
    NotFound,
    Refused,
    SettingsError,
    TooLarge,
    TooSlow,
    Unauthenticated,
    Unavailable,
    UnsupportedMediaType,
)
from pipeline.settings import Settings, get_settings

log = logging.getLogger("nightshift.api")


@dataclass(frozen=True)
class ApiConfig:
    """The API's own settings (declared in pipeline.settings) and how it was started; secrets
    never appear in its repr."""

    api_token: str | None = field(default=None, repr=False)
    metrics_token: str | None = field(default=None, repr=False)
    """A read-only token for Prometheus: it opens /metrics and nothing else."""
    approval_webhook_secret: str | None = field(default=None, repr=False)
    """Signs `POST /approvals/...`: a different secret from the events', so an event sender
    cannot sign an approval."""
    event_webhook_secret: str | None = field(default=None, repr=False)
    session_secret: str | None = field(default=None, repr=False)
    """Signs status-page sessions (NIGHTSHIFT_SESSION_SECRET); unset, the data dir's own key
    (pipeline/api/sessions.py). Several API hosts behind one name share one."""
    insecure_no_auth: bool = False
    max_body_bytes: int = Settings.api_max_body_bytes
    body_seconds: float = Settings.api_body_seconds
    """A request's body must arrive whole within this long of its headers."""
    anonymous_uploads: int = Settings.api_anonymous_uploads
    """Bodies read at once from callers that prove no one; more are refused until one ends."""
    identity_header: str | None = None
    """A reverse proxy's header naming the signed-in person (e.g. X-Forwarded-Email). Off
    unless set: trusted only on requests from `trusted_proxies`."""
    trusted_proxies: frozenset[str] = Settings.identity_proxies
    forwarded_allow_ips: frozenset[str] = frozenset()
    """Reverse proxies (addresses or networks) whose X-Forwarded-For and X-Forwarded-Proto are
    believed. Empty (the default): a request's address is its socket's, whatever it sends."""

    @classmethod
    def from_settings(cls, settings: Settings, *, insecure_no_auth: bool = False) -> ApiConfig:
        config = cls(
            api_token=settings.api_token,
            metrics_token=settings.metrics_token,
            approval_webhook_secret=settings.approval_webhook_secret,
            event_webhook_secret=settings.event_webhook_secret,
            session_secret=settings.session_secret,
            insecure_no_auth=insecure_no_auth,
            max_body_bytes=settings.api_max_body_bytes,
            body_seconds=settings.api_body_seconds,
            anonymous_uploads=settings.api_anonymous_uploads,
            identity_header=settings.identity_header,
            trusted_proxies=settings.identity_proxies,
            forwarded_allow_ips=settings.forwarded_allow_ips,
        )
        if config.approval_webhook_secret and (
            config.approval_webhook_secret == config.event_webhook_secret
        ):
            raise SettingsError(
                "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET and NIGHTSHIFT_EVENT_WEBHOOK_SECRET must "
                "differ: with one secret, whoever may send events could sign approvals"
            )
        if config.api_token is None and not insecure_no_auth:
            raise SettingsError(
                "NIGHTSHIFT_API_TOKEN is not set, so the API would be open to anyone: set it "
                "(e.g. to the output of `python -c 'import secrets; print(secrets.token_urlsafe"
                "(32))'`) or pass --insecure-no-auth on a trusted machine"
            )
        return config

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, insecure_no_auth: bool = False
    ) -> ApiConfig:
        """From this process's settings, or from the settings `env` holds."""
        settings = get_settings() if env is None else Settings.from_env(env)
        return cls.from_settings(settings, insecure_no_auth=insecure_no_auth)

    def token_matches(self, given: str | None) -> bool:
        return _same(given, self.api_token)

    def metrics_token_matches(self, given: str | None) -> bool:
        return _same(given, self.api_token) or _same(given, self.metrics_token)


def _same(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; False when either side is missing."""
    if given is None or expected is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


# The one mapping of errors to statuses: each error derives from one base (pipeline/errors.py);
# a refinement (TooLarge of Invalid, Gone of NotFound) comes before the base it refines.
_STATUS_FOR: tuple[tuple[type[NightshiftError], int], ...] = (
    (Gone, 410),
    (NotFound, 404),
    (Unauthenticated, 401),
    (Refused, 403),
    (Conflict, 409),
    (TooLarge, 413),
    (TooSlow, 408),
    (Malformed, 400),
    (UnsupportedMediaType, 415),
    (Invalid, 422),
    (Unavailable, 503),  # this deployment cannot do it now: not the caller's mistake
    (Misconfigured, 500),
    (Failed, 500),
)
INTERNAL = "internal error; the server log has the details"


def status_for(exc: NightshiftError) -> int:
    return next((status for kind, status in _STATUS_FOR if isinstance(exc, kind)), 500)


def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def internal_error() -> JSONResponse:
    """A failure of the server's own: what went wrong is in its log, not in the answer."""
    return error(500, INTERNAL)


def refusal(exc: NightshiftError) -> JSONResponse:
    """The answer to an error: its base's status, its message (a 5xx's stays in the log)."""
    status = status_for(exc)
    if status >= 500 and not isinstance(exc, Unavailable):
        return internal_error()
    scheme = exc.scheme if isinstance(exc, Unauthenticated) else None
    return error(status, str(exc), {"WWW-Authenticate": scheme} if scheme else None)


def _field(loc: tuple[Any, ...]) -> str:
    where, *path = loc or ("body",)
    name = ".".join(str(p) for p in path)
    if where == "body":
        return (
            f"field {name!r}" if name else "the request body (a JSON object, as application/json)"
        )
    return f"{where} parameter {name!r}"


def describe_validation(errors: list[Any]) -> str:
    return "; ".join(f"{_field(tuple(e['loc']))}: {e['msg']}" for e in errors)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = list(exc.errors())
        bad_json = [e for e in problems if e.get("type") == "json_invalid"]
        if bad_json:
            detail = bad_json[0].get("ctx", {}).get("error", "malformed")
            return refusal(Malformed(f"the request body is not valid JSON: {detail}"))
        return refusal(Invalid(describe_validation(problems)))

    @app.exception_handler(NightshiftError)
    async def refused(request: Request, exc: NightshiftError) -> JSONResponse:
        if status_for(exc) >= 500 and not isinstance(exc, Unavailable):
            log.error("%s %s failed: %s", request.method, request.url.path, exc)
        return refusal(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Routing's own answers (no such path, not that method), and FastAPI's 400 for a body
        # it could not parse; every error of nightshift's is a NightshiftError.
        headers = exc.headers
        if exc.status_code == 405:  # every route of the path, not only the first that matched
            headers = {**(headers or {}), "Allow": ", ".join(_methods_of(request))}
        return error(exc.status_code, str(exc.detail), headers)

    @app.exception_handler(DataError)
    async def unstorable(request: Request, exc: DataError) -> JSONResponse:
        # The body guard (pipeline/api/middleware.py) refuses such values before any route;
        # PostgreSQL's message quotes the value (its CONTEXT line), so the log names only what.
        if _unstorable_text(exc.orig):
            return refusal(Invalid("a value holds a character that cannot be stored"))
        what = f"{type(exc.orig).__name__} (SQLSTATE {getattr(exc.orig, 'sqlstate', None)})"
        log.error("%s %s failed: %s", request.method, request.url.path, what)
        return internal_error()

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return internal_error()


def _unstorable_text(orig: BaseException | None) -> bool:
    """PostgreSQL's refusal of a character (a NUL in jsonb, or one outside the encoding), or
    psycopg's of a NUL in text (which it refuses before sending, with no SQLSTATE)."""
    refused_characters = (psycopg.errors.UntranslatableCharacter,
                          psycopg.errors.CharacterNotInRepertoire)  # fmt: skip
    if isinstance(orig, refused_characters):
        return True
    return type(orig) is psycopg.DataError and getattr(orig, "sqlstate", None) is None


def _methods_of(request: Request) -> list[str]:
    path = request.url.path
    methods = {m for route in _routes(request.app.routes) if route.path_regex.match(path)
               for m in route.methods or ()}  # fmt: skip
    return sorted(methods)


def _routes(routes: Iterable[Any]) -> Iterator[APIRoute]:
    """Every route, also those of included routers (FastAPI nests them)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):
            yield from _routes(route.original_router.routes)
