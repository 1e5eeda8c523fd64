"""Issue 31's reproductions at the edges, against a live API (uvicorn on a socket, configured
as `nightshift api` configures it) and real workers: what a second red team got through now
refuses, escapes or is cut off."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest
from sqlalchemy import update

from models import Batch, Run, RunStatus
from pipeline.db import transaction
from pipeline.sandbox.githost import GitHostSandbox
from tests.integration.api_fixtures import (
    AUTH,
    TOKEN,
    api_answers,
    count,
    live_server,
    make_app,
    park_on_approval,
    person_token,
    submit_login,
)
from tests.integration.conftest import ProcessFactory
from tests.servers import free_port
from tests.support import run_row, wait_for, wait_for_status

NIGHTSHIFT = str(Path(sys.executable).parent / "nightshift")
ECHO = "tests.fixture_agents:ECHO"
"""An agent whose input takes any further field, of any shape."""

FORGED = "INFO nightshift.decisions action price_synthesis:sku-2:night: approve by pricing@x.com"


def test_a_newline_in_an_input_cannot_forge_a_log_line(
    githost: GitHostSandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    tmp_path: Path,
) -> None:
    # given a worker, and an agent whose action key (so the line that says the run parked on
    # it) quotes its input's `repo`
    register_agents("tests.fixture_agents:APPROVAL_ONLY")
    processes("w1")
    with live_server(make_app()) as base:
        # when a caller starts a run whose repo carries a newline and a whole log line
        bug = {"issue": 7, "repo": f"acme/shop\n{FORGED}\r\x1b[2K"}
        body = {"agent": "approval_only", "input": bug}
        started = httpx.post(f"{base}/runs", json=body, headers=AUTH)
    assert started.status_code == 201, started.text
    wait_for_status(uuid.UUID(started.json()["run_id"]), {RunStatus.WAITING.value})
    # then the worker's line about it (logged once the park committed) is one line, the
    # newline written as its escape
    escaped = f"acme/shop\\n{FORGED}\\r\\x1b[2K"

    def logged() -> str | None:
        text = (tmp_path / "w1.log").read_text()
        return text if escaped in text else None

    log = wait_for(logged, timeout=30, what="the worker's line about the parked run")
    assert not [line for line in log.splitlines() if line.startswith("INFO nightshift")]


# -- three 500s: each a clear 4xx now -------------------------------------------------------


def test_raw_surrogate_bytes_in_an_input_are_a_422(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with live_server(make_app()) as base:
        # when a run's input holds half of a surrogate pair as raw UTF-8 bytes (no escape)
        body = b'{"agent": "patch", "input": {"issue": 7, "repo": "a/b", "title": "\xed\xa0\x80"}}'
        headers = {**AUTH, "Content-Type": "application/json"}
        started = httpx.post(f"{base}/runs", content=body, headers=headers)
    # then it is refused, saying what, and nothing is stored or logged as an error
    assert started.status_code == 422, started.text
    assert "lone surrogate" in started.json()["error"]
    assert count(Run) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_batch_page_far_past_its_last_is_a_4xx(db_url: str) -> None:
    # given a batch with a child
    park_on_approval()
    with transaction() as session:
        session.add(Batch(id="night-1", name="patches"))
        session.execute(update(Run).values(batch_id="night-1"))
    with live_server(make_app()) as base, httpx.Client(base_url=base) as browser:
        submit_login(browser, {"token": person_token()})
        # when a signed-in person asks for page 10**17 (its offset is past a bigint), or page 2
        far = browser.get("/ui/batches/night-1", params={"page": str(10**17)})
        next_one = browser.get("/ui/batches/night-1", params={"page": "2"})
        first = browser.get("/ui/batches/night-1", params={"page": "1"})
    # then there is no such page, said on the page
    assert far.status_code == 404, far.text
    assert "no page 100000000000000000" in far.text and "1 page(s)" in far.text
    assert next_one.status_code == 404
    assert first.status_code == 200


def _nested(depth: int) -> object:
    value: object = "bottom"
    for _ in range(depth - 1):
        value = {"deeper": value}
    return value


def test_an_input_nested_too_deep_is_refused_at_start(
    db_url: str, register_agents: Callable[..., None]
) -> None:
    # given an agent whose input takes fields of any shape
    register_agents(ECHO)
    with live_server(make_app()) as base:
        # when a run's input is nested 260 deep
        body = {"agent": "echo_outside", "input": {"word": "hi", "extra": _nested(258)}}
        refused = httpx.post(f"{base}/runs", json=body, headers=AUTH)
        # and as deep as may be
        ok_body = {"agent": "echo_outside", "input": {"word": "hi", "extra": _nested(62)}}
        started = httpx.post(f"{base}/runs", json=ok_body, headers=AUTH)
        assert started.status_code == 201, started.text
        shown = httpx.get(f"{base}/runs/{started.json()['run_id']}", headers=AUTH)
    # then the first is refused in one line naming the limit, and starts nothing
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == (
        "input for agent 'echo_outside' is nested too deeply: objects and arrays may sit at "
        "most 64 levels within each other"
    )
    # while the one within the limit is started and can be shown
    assert shown.status_code == 200, shown.text
    assert count(Run) == 1


# -- identity-proxy mode: the proxy's sign-in cannot be borrowed by another site's page -------


def test_with_an_identity_proxy_a_page_of_another_site_cannot_cancel_a_run(db_url: str) -> None:
    # given an API behind an identity proxy on 127.0.0.1, and a run waiting for approval
    app = make_app(identity_header="X-Forwarded-Email", trusted_proxies=frozenset({"127.0.0.1"}))
    run_id = park_on_approval()
    signed_in = {"X-Forwarded-Email": "alice@example.com"}
    with live_server(app) as base:
        cancel = f"{base}/runs/{run_id}/cancel"
        # when a page of another site posts the browser there through the proxy: a form with
        # its Origin, or any request the browser marks as another site's
        tried = {
            "a form from another origin": httpx.post(
                cancel, data={"reason": "cancelled"},
                headers={**signed_in, "Origin": "https://evil.example"},
            ),
            "an empty form from another origin": httpx.post(
                cancel, headers={**signed_in, "Origin": "https://evil.example",
                                 "Content-Type": "application/x-www-form-urlencoded"},
            ),
            "json marked cross-site": httpx.post(
                cancel, json={}, headers={**signed_in, "Sec-Fetch-Site": "cross-site"}
            ),
            "a sibling site": httpx.post(
                cancel, json={}, headers={**signed_in, "Sec-Fetch-Site": "same-site"}
            ),
            "a sandboxed page (Origin: null)": httpx.post(
                cancel, json={}, headers={**signed_in, "Origin": "null"}
            ),
        }  # fmt: skip
        # then each is refused, saying why in one line, and the run still waits
        statuses = {what: answer.status_code for what, answer in tried.items()}
        assert set(statuses.values()) == {403}, {w: a.text for w, a in tried.items()}
        assert "evil.example" in tried["a form from another origin"].json()["error"]
        assert run_row(run_id).status == RunStatus.WAITING

        # while the API's own page (same origin) and a client that is no browser still may
        own = {**signed_in, "Sec-Fetch-Site": "same-origin", "Origin": "https://api.example"}
        assert httpx.post(cancel, json={}, headers={**own}).status_code == 200
        other = park_on_approval(key="patch:acme/shop:patch/issue-8")
        plain = httpx.post(f"{base}/runs/{other}/cancel", headers=signed_in)
    assert plain.status_code == 200, plain.text
    assert run_row(run_id).status == RunStatus.CANCELLED
    assert run_row(other).status == RunStatus.CANCELLED


# -- slow bodies from nobody: cut off at the deadline, a few at a time ----------------------

MIB = 1024 * 1024


class SlowSenders:
    """`count` connections to the API, each with no credential: the headers of a 1 MiB
    `POST /runs`, 960 KiB of its body at once, then a KiB every half second, never the end.
    Each one's fate is what came back first (a status line) and when the server closed it."""

    def __init__(self, port: int, count: int) -> None:
        head = (
            f"POST /runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {MIB}\r\n\r\n"
        ).encode()
        self.started = time.monotonic()
        self.sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
        self.pending = {s: head + b"{" + b" " * (960 * 1024) for s in self.sockets}
        self.answered: dict[socket.socket, bytes] = {}
        self.closed_after: dict[socket.socket, float] = {}
        for each in self.sockets:
            each.setblocking(False)

    def step(self, drip: bool) -> None:
        for each in self.sockets:
            if each in self.closed_after:
                continue
            try:
                received = each.recv(4096)
            except BlockingIOError:
                received = None
            except OSError:
                received = b""
            if received:
                self.answered.setdefault(each, received.split(b"\r\n")[0])
            if received == b"":
                self.closed_after[each] = time.monotonic() - self.started
                continue
            self._send(each, drip)

    def _send(self, each: socket.socket, drip: bool) -> None:
        if drip and not self.pending[each]:
            self.pending[each] = b" " * 1024
        try:
            sent = each.send(self.pending[each])
            self.pending[each] = self.pending[each][sent:]
        except BlockingIOError:
            pass
        except OSError:
            self.closed_after[each] = time.monotonic() - self.started

    def close(self) -> None:
        for each in self.sockets:
            each.close()


def test_slow_bodies_from_nobody_are_cut_off_within_the_deadline_with_bounded_memory(
    db_url: str, tmp_path: Path
) -> None:
    # given `nightshift api` with a 3-second body deadline
    port = free_port()
    env = {**os.environ, "NIGHTSHIFT_API_TOKEN": TOKEN, "NIGHTSHIFT_API_BODY_SECONDS": "3"}
    with (tmp_path / "api.log").open("w") as log:
        api = subprocess.Popen([NIGHTSHIFT, "api", "--port", str(port)], env=env, stdout=log,
                               stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: api_answers(base), timeout=60, what="the API to answer /healthz")
        server = psutil.Process(api.pid)
        before = server.memory_info().rss
        # when 200 connections with no token each send most of a 1 MiB body, then drip the rest
        senders = SlowSenders(port, 200)
        peak, last_drip, person = before, 0.0, None
        while len(senders.closed_after) < 200 and time.monotonic() - senders.started < 30:
            drip = time.monotonic() - last_drip > 0.5
            last_drip = time.monotonic() if drip else last_drip
            senders.step(drip)
            peak = max(peak, server.memory_info().rss)
            if person is None and time.monotonic() - senders.started > 1:
                # and meanwhile, someone with a token starts a run
                body = {"agent": "nightly_report", "input": {"team": "ops", "date": "2026-11-29"}}
                person = httpx.post(f"{base}/runs", json=body, headers=AUTH, timeout=10)
            time.sleep(0.01)
        senders.close()
    finally:
        api.terminate()
        api.wait(timeout=30)
    # then every connection was closed by the server within the deadline (and some slack for a
    # loaded machine): the first 16 read until the deadline, a 408; the rest at once, a 503
    assert len(senders.closed_after) == 200, (tmp_path / "api.log").read_text()[-2000:]
    assert max(senders.closed_after.values()) < 3 + 5, sorted(senders.closed_after.values())
    statuses = Counter(line.split(b" ")[1] for line in senders.answered.values())
    assert statuses.keys() <= {b"408", b"503"} and statuses[b"408"] <= 16, statuses
    # holding a few bodies at a time (each at most 1 MiB), never all of them
    assert peak - before < 64 * MIB, f"{before / MIB:.0f} MiB -> {peak / MIB:.0f} MiB"
    # while the caller with a token was served
    assert person is not None and person.status_code == 201, person
