"""HTTP plumbing for the sandbox: JSON requests and replies on a loopback threading server."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from pipeline.errors import Failed

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    """Lower-cased names."""
    body: Any
    params: dict[str, str] = field(default_factory=dict)
    """Values captured by the route's `{name}` placeholders."""
    raw: bytes = b""
    """The body as it arrived (what a signature covers)."""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json_object(self) -> dict[str, Any]:
        if not isinstance(self.body, dict):
            raise Rejected(400, "the request body must be a JSON object")
        return self.body


@dataclass
class Response:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


# The sandbox services' own errors (they raise and answer them), so they stay in the sandbox.
class Rejected(Failed):
    """The request is refused with an HTTP error status and a JSON error body (the sandbox
    service's own status, as the service it stands in for would answer: not the API's)."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


class Hangup(Failed):
    """Close the connection without replying (a lost reply, as the client sees it)."""


class App(Protocol):
    def dispatch(self, request: Request) -> Response: ...

    def error_body(self, status: int, message: str, extra: dict[str, Any]) -> Any: ...


class LoopbackServer(ThreadingHTTPServer):
    """A threading HTTP server on 127.0.0.1 (or another local address, for worker hosts in
    network namespaces) that can cut its open connections on stop."""

    daemon_threads = True
    # Hundreds of worker threads connect at once (bench/model_wait.py): the default backlog of 5
    # resets the rest.
    request_queue_size = 256

    def __init__(self, app: App, port: int = 0, host: str = "127.0.0.1") -> None:
        super().__init__((host, port), _RequestHandler)
        self.app = app
        self._open: set[socket.socket] = set()
        self._open_changed = threading.Condition()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_changed:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        try:
            super().shutdown_request(request)
        finally:
            with self._open_changed:
                self._open.discard(request)
                self._open_changed.notify_all()

    def close_connections(self, timeout: float) -> None:
        """Cut idle keep-alive connections and wait for their handler threads to finish."""
        with self._open_changed:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._open_changed.wait_for(lambda: not self._open, timeout)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client that went away mid-reply is normal here (timeouts, killed workers)
        logger.exception("sandbox connection from %s failed", client_address)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without this, Nagle holds the body ~40 ms.
    disable_nagle_algorithm = True
    server: LoopbackServer

    def _handle(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if len(raw) < length:  # the client died mid-request (a killed worker): nothing to serve
            self.close_connection = True
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        app = self.server.app
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            response = Response(400, app.error_body(400, "the body is not valid JSON", {}))
        else:
            request = Request(
                self.command, url.path, dict(parse_qsl(url.query)), headers, body, raw=raw
            )
            try:
                response = app.dispatch(request)
            except Hangup:
                self.close_connection = True
                return
            except Exception as e:  # a sandbox bug: say so to the client rather than hang up
                logger.exception("sandbox handler failed for %s %s", self.command, url.path)
                response = Response(500, app.error_body(500, f"sandbox error: {e!r}", {}))
        payload = json.dumps(response.body).encode()
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the delivery log is the record; access logs would only add noise to test output
