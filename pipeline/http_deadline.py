"""Outbound HTTP with a total deadline: the connection, TLS, the request and the answer's
headers and body must all be over within one time from the request's start, however the other
side behaves.

httpx's own timeouts are per operation: a receiver that drips one byte every 3 s never trips a
5 s read timeout, and held a webhook sender for minutes. Here every socket operation is given
at most the time left before the request's deadline, and past it the next one fails
(`httpx.TimeoutException`, a temporary error like any timeout). Name resolution is the system
resolver's and is not bounded here: the runtime's webhooks go to an address resolved and
checked beforehand (pipeline/runs/outbound.py).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from typing import Any

import httpcore
import httpx

_DEADLINE: ContextVar[float | None] = ContextVar("nightshift_http_deadline", default=None)
"""The monotonic time the request being sent in this context must be over by."""

_ERRORS: Sequence[tuple[type[Exception], type[httpx.HTTPError]]] = (
    # Most specific first: the first match is the one raised.
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


def client(seconds: float, **options: Any) -> httpx.Client:
    """An httpx client each of whose requests is over within `seconds` of its start (its
    answer read in full, as `Client.request` does). No proxy from the environment: the
    request goes where its URL says, within the deadline."""
    return httpx.Client(
        transport=DeadlineTransport(seconds), timeout=seconds, trust_env=False, **options
    )


def request(method: str, url: str, seconds: float, **options: Any) -> httpx.Response:
    """One request over within `seconds`, as `httpx.request` makes one (a client of its own,
    the answer read in full)."""
    with client(seconds) as one:
        return one.request(method, url, **options)


@cache
def _verified() -> ssl.SSLContext:
    """The system's certificates, loaded once per process rather than once per client."""
    return httpx.create_ssl_context()


class DeadlineTransport(httpx.BaseTransport):
    """httpx's transport over httpcore's connection pool, with a total deadline per request."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._pool = httpcore.ConnectionPool(ssl_context=_verified(), network_backend=_Backend())

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        deadline = time.monotonic() + self.seconds
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _until(deadline):
            answer = self._pool.handle_request(core)
        assert isinstance(answer.stream, Iterable)
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=_Body(answer.stream, deadline),
            extensions=answer.extensions,
        )

    def close(self) -> None:
        self._pool.close()


class _Body(httpx.SyncByteStream):
    """The answer's body, each read of it held to the request's deadline."""

    def __init__(self, chunks: Iterable[bytes], deadline: float) -> None:
        self._chunks = chunks
        self._deadline = deadline

    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._chunks)
        while True:
            with _until(self._deadline):
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            with _mapped():
                close()


@contextmanager
def _until(deadline: float) -> Iterator[None]:
    token = _DEADLINE.set(deadline)
    try:
        with _mapped():
            yield
    finally:
        _DEADLINE.reset(token)


@contextmanager
def _mapped() -> Iterator[None]:
    """httpcore's errors as httpx's, as httpx's own transport raises them."""
    try:
        yield
    except Exception as exc:
        for theirs, ours in _ERRORS:
            if isinstance(exc, theirs):
                raise ours(str(exc)) from exc
        raise


def _left(timeout: float | None, error: type[httpcore.TimeoutException]) -> float | None:
    """The operation's timeout, at most the time left before the deadline (none set: as is);
    `error` once it has passed."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the request's total deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        # Python's ssl holds the whole handshake to the socket's timeout, however many reads
        # the other side makes it do.
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)
