"""An outbound request is over within its total deadline however the other side behaves: one
that drips its answer a byte at a time, one that never answers, one that stalls the TLS
handshake; an answer in time is read in full."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from pipeline import http_deadline

DEADLINE = 1.0
SLACK = 1.5
"""Past the deadline, what the test allows before calling the request unbounded (the other
side would hold it for minutes)."""


def _serve(handle: Callable[[socket.socket], None]) -> Iterator[str]:
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            held.append(connection)
            threading.Thread(target=handle, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for connection in held:
        connection.close()


def _drip(connection: socket.socket, first: bytes, byte: bytes, every: float = 0.2) -> None:
    try:
        connection.recv(65536)
        connection.sendall(first)
        for _ in range(3000):
            time.sleep(every)
            connection.sendall(byte)
    except OSError:
        return  # the client hung up: the point


@pytest.fixture
def dripping() -> Iterator[str]:
    """Headers in time, then a body of a byte every 0.2 s (a 5 s read timeout never trips)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
    yield from _serve(lambda connection: _drip(connection, head, b"x"))


@pytest.fixture
def dripping_headers() -> Iterator[str]:
    yield from _serve(lambda connection: _drip(connection, b"HTTP/1.1 200 OK\r\n", b"X"))


@pytest.fixture
def stalling_tls() -> Iterator[str]:
    """A TLS record header announcing 16 KiB of handshake, then a byte every 0.2 s."""
    yield from _serve(lambda connection: _drip(connection, b"\x16\x03\x03\x40\x00", b"\x00"))


@pytest.fixture
def silent() -> Iterator[str]:
    """Accepts, reads the request, never answers."""
    yield from _serve(lambda connection: _drip(connection, b"", b"", every=60))


@pytest.fixture
def prompt() -> Iterator[str]:
    body = b'{"ok": true}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    def handle(connection: socket.socket) -> None:
        connection.recv(65536)
        connection.sendall(answer)

    yield from _serve(handle)


def _timed(url: str) -> tuple[BaseException | None, float]:
    with http_deadline.client(DEADLINE) as client:  # its TLS context loaded before the clock
        started = time.monotonic()
        try:
            client.post(url, content=b"{}")
        except httpx.HTTPError as exc:
            return exc, time.monotonic() - started
    return None, time.monotonic() - started


@pytest.mark.parametrize("server", ["dripping", "dripping_headers", "silent"])
def test_an_answer_that_never_ends_is_cut_off_at_the_deadline(
    server: str, request: pytest.FixtureRequest
) -> None:
    address = request.getfixturevalue(server)
    error, took = _timed(f"http://{address}/hooks")
    assert isinstance(error, httpx.TimeoutException), error
    assert DEADLINE * 0.9 <= took < DEADLINE + SLACK


def test_a_tls_handshake_that_never_ends_is_cut_off_at_the_deadline(stalling_tls: str) -> None:
    error, took = _timed(f"https://{stalling_tls}/hooks")
    assert isinstance(error, httpx.ConnectTimeout), error
    assert took < DEADLINE + SLACK


def test_an_answer_in_time_is_read_in_full(prompt: str) -> None:
    with http_deadline.client(DEADLINE) as client:
        answer = client.post(f"http://{prompt}/hooks", content=b"{}")
    assert (answer.status_code, answer.json()) == (200, {"ok": True})


def test_a_refused_connection_is_httpxs_connect_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    with pytest.raises(httpx.ConnectError), http_deadline.client(DEADLINE) as client:
        client.get(f"http://127.0.0.1:{port}/")
