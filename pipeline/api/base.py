"""What every HTTP route shares: the API's settings, errors as `{"error": ...}` with their
status, and the middleware (body limit, security headers)."""

from __future__ import annotations

import hmac
import logging
import os
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pipeline.errors import (
    InputTooLarge,
    InvalidInput,
    NightshiftError,
    NoModel,
    RunNotFound,
    SettingsError,
    StatusConflict,
    UnknownAction,
    UnknownAgent,
)
from pipeline.registry import UnknownEventSource
from pipeline.runs.decisions import NotAnApprover
from pipeline.runs.start import IdempotencyConflict
from pipeline.views.artifacts import UnknownArtifact
from pipeline.views.batches import UnknownBatch
from pipeline.views.runs import AmbiguousRunId

log = logging.getLogger("nightshift.api")

MIN_SECRET_LENGTH = 16
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")
_NOT_IDENTITY_HEADERS = {"authorization", "cookie", "host", "content-type", "content-length"}
DEFAULT_MAX_BODY = 1024 * 1024


@dataclass(frozen=True)
class ApiConfig:
    """The API's own settings, from the environment; secrets never appear in its repr."""

    api_token: str | None = field(default=None, repr=False)
    metrics_token: str | None = field(default=None, repr=False)
    """A read-only token for Prometheus: it opens /metrics and nothing else."""
    approval_webhook_secret: str | None = field(default=None, repr=False)
    """Signs `POST /approvals/...`: a different secret from the events', so an event sender
    cannot sign an approval."""
    event_webhook_secret: str | None = field(default=None, repr=False)
    insecure_no_auth: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY
    identity_header: str | None = None
    """A reverse proxy's header naming the signed-in person (e.g. X-Forwarded-Email). Off
    unless set: trusted only on requests from `trusted_proxies`."""
    trusted_proxies: frozenset[str] = frozenset({"127.0.0.1", "::1"})

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, insecure_no_auth: bool = False
    ) -> ApiConfig:
        env = os.environ if env is None else env
        raw_limit = env.get("NIGHTSHIFT_API_MAX_BODY_BYTES") or str(DEFAULT_MAX_BODY)
        if not raw_limit.isdigit() or int(raw_limit) < 1024:
            raise SettingsError(
                f"NIGHTSHIFT_API_MAX_BODY_BYTES must be a whole number >= 1024 (got {raw_limit!r})"
            )
        if env.get("NIGHTSHIFT_WEBHOOK_SECRET"):
            raise SettingsError(
                "NIGHTSHIFT_WEBHOOK_SECRET is no longer read: approvals and events have "
                "separate secrets now; set NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET and "
                "NIGHTSHIFT_EVENT_WEBHOOK_SECRET (two different values) and unset it"
            )
        header = env.get("NIGHTSHIFT_IDENTITY_HEADER") or None
        if header is not None and (
            not _HEADER_NAME.fullmatch(header) or header.lower() in _NOT_IDENTITY_HEADERS
        ):
            raise SettingsError(
                "NIGHTSHIFT_IDENTITY_HEADER must name the header your proxy sets to the "
                f"signed-in person, e.g. X-Forwarded-Email (got {header[:60]!r})"
            )
        proxies = env.get("NIGHTSHIFT_IDENTITY_PROXIES") or "127.0.0.1,::1"
        config = cls(
            identity_header=header,
            trusted_proxies=frozenset(p.strip() for p in proxies.split(",") if p.strip()),
            api_token=_secret(env, "NIGHTSHIFT_API_TOKEN"),
            metrics_token=_secret(env, "NIGHTSHIFT_METRICS_TOKEN"),
            approval_webhook_secret=_secret(env, "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET"),
            event_webhook_secret=_secret(env, "NIGHTSHIFT_EVENT_WEBHOOK_SECRET"),
            insecure_no_auth=insecure_no_auth,
            max_body_bytes=int(raw_limit),
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

    def token_matches(self, given: str | None) -> bool:
        return _same(given, self.api_token)

    def metrics_token_matches(self, given: str | None) -> bool:
        return _same(given, self.api_token) or _same(given, self.metrics_token)

    def session_key(self) -> bytes:
        """Signs status-page sessions; changes (ending every session) when the token does.
        Without a token, a random key: sessions last as long as the process."""
        if self.api_token is None:
            return secrets.token_bytes(32)
        return hmac.digest(self.api_token.encode(), b"nightshift status page sessions", "sha256")


def _secret(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name) or None
    if value is not None and len(value) < MIN_SECRET_LENGTH:
        raise SettingsError(f"{name} must be at least {MIN_SECRET_LENGTH} characters long")
    return value


def _same(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; False when either side is missing."""
    if given is None or expected is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


class ApiError(Exception):
    """An error with its HTTP status, answered as {"error": message}."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


# Most specific first: DecisionConflict is a StatusConflict, InputTooLarge an InvalidInput.
_STATUS_FOR: tuple[tuple[type[NightshiftError], int], ...] = (
    (RunNotFound, 404),
    (UnknownBatch, 404),
    (UnknownArtifact, 404),
    (UnknownAction, 404),
    (UnknownEventSource, 404),
    (NotAnApprover, 403),
    (IdempotencyConflict, 409),
    (AmbiguousRunId, 409),
    (StatusConflict, 409),
    (InputTooLarge, 413),
    (InvalidInput, 422),
    (UnknownAgent, 422),
    (NoModel, 503),  # this deployment cannot run the agent: not the caller's mistake
)


def status_for(exc: NightshiftError) -> int:
    return next((status for kind, status in _STATUS_FOR if isinstance(exc, kind)), 500)


def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


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
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error(exc.status, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = list(exc.errors())
        bad_json = [e for e in problems if e.get("type") == "json_invalid"]
        if bad_json:
            detail = bad_json[0].get("ctx", {}).get("error", "malformed")
            return error(400, f"the request body is not valid JSON: {detail}")
        return error(422, describe_validation(problems))

    @app.exception_handler(NightshiftError)
    async def refused(request: Request, exc: NightshiftError) -> JSONResponse:
        status = status_for(exc)
        if status == 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc)
            return error(500, "internal error; the server log has the details")
        return error(status, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = exc.headers
        if exc.status_code == 405:  # every route of the path, not only the first that matched
            headers = {**(headers or {}), "Allow": ", ".join(_methods_of(request))}
        return error(exc.status_code, str(exc.detail), headers)

    @app.exception_handler(DataError)
    async def unstorable(request: Request, exc: DataError) -> JSONResponse:
        # PostgreSQL text and jsonb cannot hold U+0000: a value with one is refused, not stored.
        if "NUL" in str(exc.orig):
            return error(422, "a value holds a NUL (U+0000) character, which cannot be stored")
        log.error("%s %s failed: %s", request.method, request.url.path, exc.orig)
        return error(500, "internal error; the server log has the details")

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error(500, "internal error; the server log has the details")


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


class BodyLimit:
    """Refuse request bodies over the limit, by Content-Length and by the bytes that arrive."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and not declared.isdigit():
            response = error(400, "Content-Length must be a whole number of bytes")
            await response(scope, receive, send)
            return
        if declared is not None and int(declared) > self.limit:
            await self._too_large(scope, receive, send, declared.decode())
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before sending its body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(scope, receive, send, f"more than {self.limit}")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, size: str) -> None:
        message = (
            f"the request body is {size} bytes; the limit is {self.limit} "
            "(NIGHTSHIFT_API_MAX_BODY_BYTES)"
        )
        await error(413, message)(scope, receive, send)


_SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
_CSP = (
    b"default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
    b"connect-src 'self'; "  # the pages' live feed (EventSource)
    b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class SecurityHeaders:
    """No framing (the approve buttons must not be clickjacked), no sniffing, no caching."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers += [h for h in _SECURITY_HEADERS if h[0] not in names]
                if not str(scope.get("path", "")).startswith(("/docs", "/redoc")):
                    headers.append((b"content-security-policy", _CSP))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
