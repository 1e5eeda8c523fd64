"""Where completion webhooks may go (NIGHTSHIFT_NOTIFY_ALLOWED), checked when a notify_url is
given and again, resolved, at every delivery; and a receiver that never answers costs other
runs nothing."""

from __future__ import annotations

import datetime
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select, update

from models import Action, ActionKind, ActionState, Run, RunStatus
from pipeline.db import transaction
from pipeline.delivery.sender import SEND_SECONDS, Delivery, deliver
from pipeline.runs.notifications import dispatch_new_txn
from pipeline.runs.start import create_run_txn, start_run
from pipeline.sandbox.hooks import HookSandbox
from pipeline.settings import get_settings
from tests.integration.api_fixtures import AUTH, live_server, make_app
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.integration.test_notify import REPORT, SECRET, set_status
from tests.support import Webhook, run_row, wait_for, wait_for_status, webhooks


@pytest.fixture
def receiver(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HookSandbox]:
    """A receiver on 127.0.0.1, with the policy left at its default (public addresses only)."""
    hooks = HookSandbox(secret=SECRET, log_path=tmp_path / "hooks.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_NOTIFY_SECRET", SECRET)
    monkeypatch.delenv("NIGHTSHIFT_NOTIFY_ALLOWED", raising=False)
    get_settings.cache_clear()
    yield hooks
    hooks.stop()


def _start(base: str, notify_url: str) -> httpx.Response:
    body = {"agent": "nightly_report", "input": REPORT, "notify_url": notify_url}
    return httpx.post(f"{base}/runs", json=body, headers=AUTH)


def test_a_notify_url_to_an_internal_address_is_refused_at_start(
    receiver: HookSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = receiver.url.rsplit(":", 1)[1]
    internal = [
        f"http://127.0.0.1:{port}/hooks",
        f"http://2130706433:{port}/hooks",  # 127.0.0.1 in decimal
        f"http://0x7f.1:{port}/hooks",
        f"http://[::1]:{port}/hooks",
        f"http://[::ffff:127.0.0.1]:{port}/hooks",
        f"http://localhost:{port}/hooks",
        "http://10.1.2.3/hooks",
        "http://192.168.0.1/hooks",
        "http://169.254.169.254/latest/meta-data",  # cloud metadata: link-local
    ]
    with live_server(make_app()) as base:
        for url in internal:
            refused = _start(base, url)
            assert refused.status_code == 422, (url, refused.text)
            assert "NIGHTSHIFT_NOTIFY_ALLOWED does not allow" in refused.json()["error"]
        # userinfo would be sent as Basic auth to whoever answers: refused wherever it points
        with_password = _start(base, "https://user:secret@hooks.example.com/x")
        assert with_password.status_code == 422
        assert "user name or password" in with_password.json()["error"]
        assert "secret" not in with_password.json()["error"]
        # and an operator who lists the receiver's address allows it
        monkeypatch.setenv("NIGHTSHIFT_NOTIFY_ALLOWED", "public,127.0.0.0/8")
        get_settings.cache_clear()
        allowed = _start(base, f"http://2130706433:{port}/hooks")
    assert allowed.status_code == 201, allowed.text
    with transaction() as session:
        assert session.scalar(select(Run.notify_url)) == f"http://2130706433:{port}/hooks"


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254, the cloud metadata service
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "::ffff:0:7f00:1",  # IPv4-translated 127.0.0.1
        "fec0::1",  # site-local
    ],
)
def test_an_ipv6_form_of_an_internal_address_is_refused_at_start(
    receiver: HookSandbox, address: str
) -> None:
    with live_server(make_app()) as base:
        # when a notify_url names an internal address in an IPv6 form that carries it
        refused = _start(base, f"http://[{address}]/hooks")
    # then it is refused as the address it means, and no run starts
    assert refused.status_code == 422, refused.text
    assert "NIGHTSHIFT_NOTIFY_ALLOWED does not allow" in refused.json()["error"]
    with transaction() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 0


def test_a_delivery_checks_the_address_again_and_sends_nothing_where_it_is_not_allowed(
    receiver: HookSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a run whose notify_url was allowed when it started (as a name that resolved to a
    # public address then might have been)
    monkeypatch.setenv("NIGHTSHIFT_NOTIFY_ALLOWED", "127.0.0.1")
    get_settings.cache_clear()
    run_id = start_run("nightly_report", REPORT, notify_url=f"{receiver.url}/hooks/ops").run_id
    set_status(run_id, RunStatus.SUCCEEDED)
    # when, at delivery, it resolves to an address the policy does not allow
    monkeypatch.delenv("NIGHTSHIFT_NOTIFY_ALLOWED")
    get_settings.cache_clear()
    [owed] = webhooks()
    # then nothing is sent and the webhook fails, saying why
    assert deliver(owed.key) is Delivery.FAILED
    [failed] = webhooks()
    assert failed.state is ActionState.FAILED and failed.attempts == 0
    assert "resolves to 127.0.0.1" in (failed.error or "")
    assert receiver.requests() == []


class Tarpit:
    """A receiver that accepts every connection and never answers (nor closes)."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}/hooks"
        self.held: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="tarpit", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                self.held.append(connection)

    def close(self) -> None:
        self._server.close()
        with self._lock:
            for connection in self.held:
                connection.close()


class Dripper(Tarpit):
    """A receiver that answers one byte every DRIP seconds, forever: no read ever waits as long
    as a per-read timeout, so only a total deadline ends its POSTs."""

    DRIP = 1.0

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                self.held.append(connection)
            threading.Thread(target=self._drip, args=(connection,), daemon=True).start()

    def _drip(self, connection: socket.socket) -> None:
        try:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
            while True:
                time.sleep(self.DRIP)
                connection.sendall(b"x")
        except OSError:
            return  # the sender hung up


def test_a_dripping_receiver_delays_no_other_receivers_delivery_past_its_own_deadline(
    receiver: HookSandbox, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a worker's senders, and a receiver that answers a byte a second, forever
    monkeypatch.setenv("NIGHTSHIFT_NOTIFY_ALLOWED", "127.0.0.1")
    get_settings.cache_clear()
    dripper = Dripper()
    processes("w1")
    try:
        # when ten runs that told the dripper are followed by ten that tell another receiver
        _finish_notifying(dripper.url, 10)
        wait_for(lambda: dripper.held, timeout=30, what="a sender to reach the dripper")
        sent_at = _finish_notifying(f"{receiver.url}/hooks/ops", 10)
        # then each of the others arrives within one send's deadline (a worker's senders were
        # all held by the dripper for minutes: another receiver's notifications waited)
        wait_for(lambda: len(receiver.deliveries()) == 10, timeout=60,
                 what="the other receiver's notifications")  # fmt: skip
        took = [datetime.datetime.fromisoformat(d["at"]) - sent_at for d in receiver.deliveries()]
        assert max(took).total_seconds() < SEND_SECONDS, took

        # and the dripper's first was cut off at the deadline, its outcome unknown, to be sent
        # again later with its key; the dripper never held more than one sender
        def cut_off() -> list[Webhook]:
            dripped = webhooks(Action.args["url"].as_string() == dripper.url)
            return [n for n in dripped if n.attempts and n.state is not ActionState.ATTEMPTED]

        [first] = wait_for(cut_off, timeout=3 * SEND_SECONDS, what="the dripper's POST to end")
    finally:
        dripper.close()
    assert first.state is ActionState.OUTCOME_UNKNOWN and "ReadTimeout" in (first.error or "")
    assert len(dripper.held) == 1, "the dripper held more than one sender"


def _finish_notifying(url: str, runs: int) -> datetime.datetime:
    """`runs` runs that finished, owing `url` a notification, handed to the workers as the
    step that finished them would; when that committed."""
    with transaction() as session:
        for _ in range(runs):
            run = create_run_txn(session, "nightly_report", {"team": uuid.uuid4().hex,
                                 "date": "2026-11-29"}, notify_url=url)  # fmt: skip
            session.execute(
                update(Run).where(Run.id == run.run_id).values(status=RunStatus.SUCCEEDED)
            )
        dispatch_new_txn(session)
    with transaction() as session:
        committed = session.scalar(select(func.now()))
    assert committed is not None
    return committed


def _latency(day: int) -> float:
    """Seconds from the start of a nightly report with no notify_url to its end (a report of
    its own: the `day`th since 2026-01-01)."""
    date = datetime.date(2026, 1, 1) + datetime.timedelta(days=day)
    run_id = start_run("nightly_report", {"team": "ops", "date": date.isoformat()}).run_id
    wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=120)
    row = run_row(run_id)
    assert row.finished_at is not None
    return (row.finished_at - row.created_at).total_seconds()


def test_a_receiver_that_never_answers_costs_other_runs_nothing(
    sandbox: Sandbox, processes: ProcessFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    tarpit = Tarpit()
    monkeypatch.setenv("NIGHTSHIFT_NOTIFY_SECRET", SECRET)
    monkeypatch.setenv("NIGHTSHIFT_NOTIFY_ALLOWED", "127.0.0.1")
    get_settings.cache_clear()
    processes("beat", beat=True)
    processes("w1")
    try:
        # given an unrelated run's latency on this worker, measured first
        _latency(1)  # warm: agents loaded, connections open
        before = [_latency(day) for day in range(2, 7)]
        baseline = statistics.median(before)  # of five: the machine's other load adds noise
        # when 100 runs finish and notify a receiver that accepts connections, never answers
        with transaction() as session:
            for i in range(100):
                team = {"team": f"t{i}", "date": "2026-11-29"}
                noisy = create_run_txn(session, "nightly_report", team, notify_url=tarpit.url)
                session.execute(
                    update(Run).where(Run.id == noisy.run_id).values(status=RunStatus.SUCCEEDED)
                )
            dispatch_new_txn(session)  # as the step that finished them would
        dispatched = time.monotonic()
        wait_for(lambda: len(tarpit.held) >= 4, timeout=60, what="senders stuck in the tarpit")
        # then the unrelated run takes no longer than before (within 1.5x), all through what
        # the tarpit brings: the first sends time out, their retries, the tick's second task
        # for each notification the senders had no room for, the receiver's next probe. (Five
        # runs right after the first sends saw only four idle senders, or, on a slower
        # machine, part of the rest: the cost went unseen here and failed in CI.)
        covers = 3 * SEND_SECONDS + get_settings().handoff_grace_seconds
        after = [_latency(7)]
        while time.monotonic() - dispatched < covers or len(after) < 5:
            after.append(_latency(7 + len(after)))
        loaded = statistics.median(after)
        with transaction() as session:
            owed = session.scalars(select(Action).where(Action.kind == ActionKind.WEBHOOK)).all()
            now = session.scalar(select(func.now()))
    finally:
        tarpit.close()
    # A quarter of a second on top: an unrelated run takes ~50 ms on an idle worker, and three
    # test processes on two cores move that by 0.1 s from scheduling alone (CI failed three
    # times today at 0.05 -> 0.12-0.17 s, at load 5 and 30; not reproduced alone). What this
    # guards against, a worker thread or a step waiting on the tarpit, costs a whole send
    # (SEND_SECONDS) or a lease a step.
    slack = 0.25
    assert loaded <= 1.5 * baseline + slack, f"before {before}, with the tarpit {after}"
    # and the tarpit's notifications are owed, not lost: attempted, then put off with backoff
    assert len(owed) == 100 and not any(n.state is ActionState.CONFIRMED for n in owed)
    assert len(tarpit.held) <= 20, "a receiver that never answers was not backed off"
    # put off in their rows past the receiver's next probe: the tick does not hand each to a
    # worker again and again only to find the receiver still backed off (every claim of a
    # notification bumps its fence)
    claims = sum(n.fence for n in owed)
    assert claims <= 30, f"{claims} claims of {len(owed)} notifications to a receiver backed off"
    assert sum(n.next_attempt_at > now for n in owed) >= 90


def test_the_http_clients_log_lines_name_no_credential_or_query_string(
    sandbox: Sandbox, receiver: HookSandbox, processes: ProcessFactory, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # given a worker whose completion webhook URL carries a secret in its query string
    monkeypatch.setenv("NIGHTSHIFT_NOTIFY_ALLOWED", "127.0.0.1")
    get_settings.cache_clear()
    processes("w1")
    url = f"{receiver.url}/hooks/ops?key=query-secret-value"
    run_id = start_run("nightly_report", REPORT, notify_url=url).run_id
    wait_for_status(run_id, {RunStatus.SUCCEEDED.value})
    wait_for(lambda: receiver.deliveries(), timeout=60, what="the webhook to arrive")

    # then httpx's own line about the POST is in the worker's log, without the secret
    def logged() -> str | None:
        text = (tmp_path / "w1.log").read_text()
        return text if "HTTP Request: POST" in text else None

    log = wait_for(logged, timeout=30, what="httpx's request line in the worker log")
    assert "query-secret-value" not in log
    assert (
        f"HTTP Request: POST http://127.0.0.1:{receiver.url.rsplit(':', 1)[1]}/hooks/ops?***" in log
    )
