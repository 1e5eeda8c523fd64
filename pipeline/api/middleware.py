"""What every request passes before a route: the body's size and text PostgreSQL can store
(BodyGuard), the security headers of every answer, with --insecure-no-auth, requests from
this machine's own clients only (LocalOnly), and with an identity proxy, changes from this
site's own pages only (ProxiedSameSite)."""

from __future__ import annotations

import asyncio
import ipaddress
from abc import ABC, abstractmethod

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pipeline.api.base import refusal
from pipeline.api.pages import proves_someone
from pipeline.api.sessions import COOKIE
from pipeline.api.storable import unstorable_request
from pipeline.errors import (
    Malformed,
    NightshiftError,
    Refused,
    TooLarge,
    TooSlow,
    Unavailable,
    UnsupportedMediaType,
)


# The middleware's own refusals (raised and answered here only), so they stay at this edge.
class Misaddressed(Refused):
    """The request is addressed to another name than the API's own address."""


class ForeignOrigin(Refused):
    """Another site's page may not change anything here."""


class _HttpMiddleware(ABC):
    """An ASGI middleware of HTTP requests (anything else, such as the lifespan, passes)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    @abstractmethod
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None: ...


class BodyGuard(_HttpMiddleware):
    """Refuse request bodies over the limit (by Content-Length and by the bytes that arrive),
    bodies that do not arrive whole within `seconds` of the headers (408), more than
    `anonymous` bodies at once from callers that prove no one (503), and values PostgreSQL
    cannot store (pipeline/api/storable.py), before any route reads them. A slow or turned
    away sender's connection ends with the answer: it holds neither memory nor a reader."""

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        seconds: float,
        anonymous: int,
        signed: tuple[str, ...] = (),
        identity_header: str | None = None,
    ) -> None:
        super().__init__(app)
        self.limit = limit
        self.seconds = seconds
        self.anonymous = anonymous
        self.signed = signed
        """Paths of signed webhooks: their request is judged after its signature (signed_body),
        so one that proves no one is a 401 whatever it holds."""
        self.identity_header = identity_header
        self.anonymous_reading = 0
        """Bodies being read now from callers that prove no one (one event loop: no lock)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        if declared is not None and not declared.isdigit():
            malformed = Malformed("Content-Length must be a whole number of bytes")
            await _answer(malformed, scope, receive, send)
            return
        if declared is not None and int(declared) > self.limit:
            await _answer(self._too_large(declared), scope, receive, send)
            return
        uploads = declared not in (None, "0") or "transfer-encoding" in headers
        anonymous = uploads and not await self._proves_someone(scope, headers)
        if anonymous and self.anonymous_reading >= self.anonymous:
            busy = BusyReading(
                f"{self.anonymous} request bodies from callers that prove no one are being "
                "read already (NIGHTSHIFT_API_ANONYMOUS_UPLOADS); try again shortly, or send "
                "a token"
            )
            await _answer(busy, scope, receive, send, close=True)
            return
        self.anonymous_reading += anonymous
        try:
            async with asyncio.timeout(self.seconds):
                body = await self._read(receive)
        except TimeoutError:
            slow = TooSlow(
                f"the request body did not arrive whole within {self.seconds:g} s of its "
                "headers (NIGHTSHIFT_API_BODY_SECONDS)"
            )
            await _answer(slow, scope, receive, send, close=True)
            return
        except TooLarge as exc:
            await _answer(exc, scope, receive, send)
            return
        finally:
            self.anonymous_reading -= anonymous
        if body is None:
            return  # the client went away before sending its body
        signed = scope["path"].startswith(self.signed)
        problem = None if signed else unstorable_request(scope, body)
        if problem is not None:
            await _answer(problem, scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole body (None if the client went away first). Raises TooLarge."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                raise self._too_large(f"more than {self.limit}")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _proves_someone(self, scope: Scope, headers: Headers) -> bool:
        """Whether the request carries a credential that holds (asked in a thread: a token or
        a session is looked up in the database); one that carries none is not looked up."""
        request = Request(scope)
        carries = "authorization" in headers or COOKIE in request.cookies
        if self.identity_header is not None:
            carries = carries or self.identity_header in headers
        return carries and await run_in_threadpool(proves_someone, request)

    def _too_large(self, size: str) -> TooLarge:
        return TooLarge(
            f"the request body is {size} bytes; the limit is {self.limit} "
            "(NIGHTSHIFT_API_MAX_BODY_BYTES)"
        )


class BusyReading(Unavailable):
    """Too many bodies from callers that prove no one are being read at once."""


async def _answer(
    exc: NightshiftError, scope: Scope, receive: Receive, send: Send, *, close: bool = False
) -> None:
    """The error's answer; with `close`, the connection ends with it (the client may still be
    sending a body nobody will read, and uvicorn would keep the connection open for it)."""
    response = refusal(exc)
    if close:
        response.headers["connection"] = "close"
    await response(scope, receive, send)


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class LocalOnly(_HttpMiddleware):
    """With --insecure-no-auth, anything that reaches the port may act, and a web page the
    local user visits reaches it too. So: a request must be addressed to the address the API
    serves on (a page elsewhere can rebind its own name to 127.0.0.1: DNS rebinding, which would
    let it read every run too); a change may not come from another site's page (Origin); and a
    change to the JSON API must send JSON, which no page of another site can send here without
    a CORS preflight this API never grants (the status page's forms carry CSRF tokens)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        problem = _foreign(scope, Headers(scope=scope))
        if problem is not None:
            await _answer(problem, scope, receive, send)
            return
        await self.app(scope, receive, send)


def _foreign(scope: Scope, headers: Headers) -> NightshiftError | None:
    host = headers.get("host", "").lower()
    names = _own_names(scope)
    if names is not None and host not in names:
        return Misaddressed(
            f"this API serves {sorted(names)[0]}, and the request is addressed to {host!r}: "
            "with --insecure-no-auth only requests to its own address are served (another "
            "name could be a web page's, rebound to this machine)"
        )
    if scope["method"] in _SAFE_METHODS:
        return None
    sender = _another_site(headers)
    if sender is not None:
        return ForeignOrigin(
            f"{sender} may not change anything here: with --insecure-no-auth, only this API's "
            "own pages and clients that are not browsers may"
        )
    if scope["path"].startswith("/ui/"):
        return None  # the status page's forms, each with its CSRF token
    media_type = headers.get("content-type", "").split(";")[0].strip().lower()
    is_json = media_type == "application/json" or media_type.endswith("+json")
    empty = headers.get("content-length", "0") == "0" and "transfer-encoding" not in headers
    if not is_json or empty:
        return UnsupportedMediaType(
            "send a JSON body (Content-Type: application/json; {} will do): with "
            "--insecure-no-auth, a change that is not JSON could be another site's form"
        )
    return None


def _another_site(headers: Headers) -> str | None:
    """Which other site's page sent this request, as the browser says (Sec-Fetch-Site, or
    where a browser sends none, Origin against the Host it was sent to); None when it says
    this site's own page sent it, or when no browser did (neither header)."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None:
        same = fetch_site.lower() in ("same-origin", "none")  # none: typed, or a bookmark
        return None if same else f"a page of another site (Sec-Fetch-Site: {fetch_site})"
    origin = headers.get("origin")
    host = headers.get("host", "").lower()
    if origin is not None and origin.lower() not in {f"http://{host}", f"https://{host}"}:
        return f"a page of {origin}"
    return None


class ProxiedSameSite(_HttpMiddleware):
    """With an identity proxy, whoever is signed in at the proxy is signed in here too: the
    browser sends the proxy's cookie with any request to it, another site's form included, and
    the proxy adds the identity header. So a change that carries the header must come from this
    site's own pages (or from a client that is no browser): a browser's word that another
    site's page sent it (Sec-Fetch-Site, Origin) is a 403, on every route."""

    def __init__(self, app: ASGIApp, identity_header: str) -> None:
        super().__init__(app)
        self.identity_header = identity_header

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        if scope["method"] not in _SAFE_METHODS and self.identity_header in headers:
            sender = _another_site(headers)
            if sender is not None:
                refused = ForeignOrigin(
                    f"{sender} may not change anything here in the name of the person the "
                    f"identity proxy signed in ({self.identity_header})"
                )
                await _answer(refused, scope, receive, send)
                return
        await self.app(scope, receive, send)


def _own_names(scope: Scope) -> set[str] | None:
    """The Host values that name the address this request reached (None: not a TCP socket)."""
    server = scope.get("server")
    if not server:
        return None
    address, port = str(server[0]), int(server[1])
    hosts = {f"[{address}]" if ":" in address else address}
    try:
        if ipaddress.ip_address(address).is_loopback:
            hosts |= {"localhost", "127.0.0.1", "[::1]"}
    except ValueError:
        hosts.add(address.lower())  # a name (a test client's)
    default = {"http": 80, "https": 443}.get(scope.get("scheme", "http"))
    names = {f"{host}:{port}" for host in hosts}
    return names | (hosts if port == default else set())


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


class SecurityHeaders(_HttpMiddleware):
    """No framing (the approve buttons must not be clickjacked), no sniffing, no caching."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
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
