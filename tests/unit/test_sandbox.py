"""The sandbox services keep the contracts the runtime's tests rely on."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from pipeline.retry import classify, retry_after
from pipeline.sandbox import (
    EmailSandbox,
    GitHostSandbox,
    MessagesSandbox,
    PricingSandbox,
    WebSandbox,
    read_log,
    start_all,
)
from pipeline.sandbox.launcher import write_manifest
from pipeline.sandbox.responders import text_reply

REPO_ROOT = Path(__file__).resolve().parents[2]
EMAIL = {"to": "ops@example.com", "subject": "Nightly report", "body": "All quiet."}
FETCH_TOOL: Any = {
    "name": "fetch_source",
    "description": "Fetch a report source by name.",
    "input_schema": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["name"],
    },
}


@pytest.fixture
def email(tmp_path: Path) -> Iterator[EmailSandbox]:
    with EmailSandbox(log_path=tmp_path / "email.jsonl") as server:
        yield server


@pytest.fixture
def messages(tmp_path: Path) -> Iterator[MessagesSandbox]:
    with MessagesSandbox(log_path=tmp_path / "messages.jsonl", timeout_seconds=3) as server:
        yield server


def client(url: str, **kwargs: Any) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=5, **kwargs)


def model(server: MessagesSandbox, timeout: float = 5) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="test", base_url=server.url, max_retries=0, timeout=timeout)


# -- email -------------------------------------------------------------------------------------


def test_email_replays_a_key_inside_the_window_and_sends_again_after_it(
    email: EmailSandbox,
) -> None:
    with client(email.url) as http:
        first = http.post("/emails", json=EMAIL, headers={"Idempotency-Key": "report:ops"})
        again = http.post("/emails", json=EMAIL, headers={"Idempotency-Key": "report:ops"})

        assert first.status_code == again.status_code == 200
        assert again.json() == first.json()
        assert again.headers["Idempotent-Replayed"] == "true"
        assert "Idempotent-Replayed" not in first.headers
        assert len(email.deliveries()) == 1

        # A worker that comes back 30 hours later is outside the 24-hour window.
        http.post("/_control/advance", json={"seconds": 30 * 3600}).raise_for_status()
        late = http.post("/emails", json=EMAIL, headers={"Idempotency-Key": "report:ops"})

    assert late.status_code == 200
    assert late.json()["message_id"] != first.json()["message_id"]
    assert "Idempotent-Replayed" not in late.headers
    assert [d["key"] for d in read_log(email.log.path)] == ["report:ops", "report:ops"]


def test_email_refuses_a_key_reused_for_a_different_email(email: EmailSandbox) -> None:
    with client(email.url) as http:
        http.post("/emails", json=EMAIL, headers={"Idempotency-Key": "k"}).raise_for_status()
        other = http.post("/emails", json={**EMAIL, "body": "x"}, headers={"Idempotency-Key": "k"})

    assert other.status_code == 422
    assert len(email.deliveries()) == 1


@pytest.mark.parametrize("mode", ["no-keys", "no-keys-lookup"])
def test_email_without_key_support_sends_every_request(tmp_path: Path, mode: str) -> None:
    with (
        EmailSandbox(mode=mode, log_path=tmp_path / "email.jsonl") as email,  # type: ignore[arg-type]
        client(email.url) as http,
    ):
        ids = [
            http.post("/emails", json=EMAIL, headers={"Idempotency-Key": "k1"}).json()["message_id"]
            for _ in range(2)
        ]
        lookup = http.get("/emails", params={"key": "k1"})

    assert len(set(ids)) == 2
    assert len(read_log(tmp_path / "email.jsonl")) == 2
    if mode == "no-keys":
        assert lookup.status_code == 404
        assert lookup.json() == {"error": "lookup not supported"}
    else:
        assert lookup.status_code == 200
        assert [d["message_id"] for d in lookup.json()["deliveries"]] == ids


def test_email_mode_can_change_at_runtime(email: EmailSandbox) -> None:
    with client(email.url) as http:
        assert http.post("/_control/mode", json={"mode": "no-keys"}).json() == {"mode": "no-keys"}
        for _ in range(2):
            http.post("/emails", json=EMAIL, headers={"Idempotency-Key": "k"}).raise_for_status()
        assert http.post("/_control/mode", json={"mode": "sometimes"}).status_code == 400

    assert len(email.deliveries()) == 2


def test_email_delivery_is_logged_before_the_delayed_reply(email: EmailSandbox) -> None:
    with client(email.url) as http:
        http.post("/_control/delay", json={"seconds": 2}).raise_for_status()
        with pytest.raises(httpx.ReadTimeout):
            http.post("/emails", json=EMAIL, headers={"Idempotency-Key": "k"}, timeout=0.3)

    # The caller never saw a reply, yet the email went out: an outcome-unknown send.
    assert [d["key"] for d in read_log(email.log.path)] == ["k"]
    assert email.log.entries() == read_log(email.log.path)


def test_a_service_can_carry_a_write_out_and_answer_503(email: EmailSandbox) -> None:
    with client(email.url) as http:
        http.post("/_control/status-after-work", json={"status": 503}).raise_for_status()
        lied = http.post("/emails", json=EMAIL, headers={"Idempotency-Key": "k"})
        http.post("/_control/status-after-work", json={"status": None}).raise_for_status()
        again = http.post("/emails", json=EMAIL, headers={"Idempotency-Key": "k"})

    # The email went out although the caller was told 503; the resend with its key is replayed.
    assert lied.status_code == 503 and again.status_code == 200
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert [d["key"] for d in read_log(email.log.path)] == ["k"]


# -- pricing -----------------------------------------------------------------------------------


def test_pricing_applies_a_keyed_change_once(tmp_path: Path) -> None:
    with (
        PricingSandbox(log_path=tmp_path / "pricing.jsonl") as pricing,
        client(pricing.url) as http,
    ):
        change = {"price": 17.49, "currency": "USD"}
        first = http.put("/prices/sku-1", json=change, headers={"Idempotency-Key": "p1"})
        again = http.put("/prices/sku-1", json=change, headers={"Idempotency-Key": "p1"})
        reused = http.put("/prices/sku-1", json={"price": 1}, headers={"Idempotency-Key": "p1"})
        current = http.get("/prices/sku-1").json()
        lookup = http.get("/changes", params={"key": "p1"}).json()
        missing = http.get("/prices/sku-404")

    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert first.json()["previous"] == 19.99
    assert reused.status_code == 422
    assert current["price"] == 17.49
    assert [c["change_id"] for c in lookup["changes"]] == [first.json()["change_id"]]
    assert missing.status_code == 404
    assert len(read_log(tmp_path / "pricing.jsonl")) == 1


# -- git host ----------------------------------------------------------------------------------


def test_githost_two_racing_creates_open_one_pull_request(tmp_path: Path) -> None:
    pr = {"title": "Fix the flaky deploy", "head": "fix/flaky-deploy", "base": "main", "body": ""}
    start = threading.Barrier(2)
    replies: list[httpx.Response] = []

    with GitHostSandbox(log_path=tmp_path / "githost.jsonl") as githost:

        def create() -> None:
            with client(githost.url) as http:
                start.wait()
                replies.append(http.post("/repos/acme/api/pulls", json=pr))

        racers = [threading.Thread(target=create) for _ in range(2)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join()
        with client(githost.url) as http:
            query = {"head": "acme:fix/flaky-deploy", "state": "open"}
            open_prs = http.get("/repos/acme/api/pulls", params=query).json()
            other = http.get("/repos/acme/api/pulls", params={"head": "acme:other"}).json()

    # then one is opened and the other refused as GitHub refuses it
    created, refused = sorted(replies, key=lambda r: r.status_code)
    assert (created.status_code, refused.status_code) == (201, 422)
    assert created.json()["state"] == "open" and created.json()["number"] == 1
    assert created.json()["head"]["ref"] == "fix/flaky-deploy"
    assert created.json()["base"]["ref"] == "main"
    assert refused.json()["message"] == "Validation Failed"
    assert refused.json()["errors"][0]["message"] == (
        "A pull request already exists for acme:fix/flaky-deploy."
    )
    assert open_prs == [created.json()] and other == []
    assert [e["action"] for e in read_log(tmp_path / "githost.jsonl")] == ["opened"]


def test_githost_allows_a_new_pull_request_once_the_old_one_is_closed(tmp_path: Path) -> None:
    pr = {"title": "t", "head": "o:b", "base": "main"}
    with GitHostSandbox(log_path=tmp_path / "g.jsonl") as githost, client(githost.url) as http:
        http.post("/repos/o/r/pulls", json=pr).raise_for_status()
        closed = http.patch("/repos/o/r/pulls/1", json={"state": "closed"}).json()
        second = http.post("/repos/o/r/pulls", json=pr)
        reopen = http.patch("/repos/o/r/pulls/1", json={"state": "open"})
        every = http.get("/repos/o/r/pulls", params={"head": "o:b", "state": "all"}).json()

    assert closed["state"] == "closed"
    assert second.status_code == 201 and second.json()["number"] == 2
    assert reopen.status_code == 422
    assert [p["number"] for p in every] == [2, 1]  # newest first, as GitHub lists them
    assert [e["action"] for e in githost.log.entries()] == ["opened", "closed", "opened"]


def test_githost_with_a_token_answers_only_calls_that_carry_it(tmp_path: Path) -> None:
    pr = {"title": "t", "head": "b", "base": "main"}
    githost = GitHostSandbox(log_path=tmp_path / "g.jsonl", token="s3cret")
    with githost, client(githost.url) as http:
        anonymous = http.post("/repos/o/r/pulls", json=pr)
        wrong = http.get("/repos/o/r/pulls", headers={"Authorization": "Bearer nope"})
        bearer = http.post("/repos/o/r/pulls", json=pr, headers={"Authorization": "Bearer s3cret"})
        gitea = http.get("/repos/o/r/pulls", headers={"Authorization": "token s3cret"})

    assert (anonymous.status_code, wrong.status_code) == (401, 401)
    assert anonymous.json()["message"] == "Bad credentials"
    assert bearer.status_code == 201 and [p["number"] for p in gitea.json()] == [1]
    assert [e["action"] for e in githost.log.entries()] == ["opened"]


# -- web ---------------------------------------------------------------------------------------


def test_web_serves_sources_and_competitor_prices(tmp_path: Path) -> None:
    with WebSandbox(log_path=tmp_path / "web.jsonl") as web, client(web.url) as http:
        sources = {n: http.get(f"/sources/{n}").json() for n in ("incidents", "deploys", "oncall")}
        competitors = http.get("/competitors").json()
        prices = http.get("/competitors/c07/prices").json()
        prices_again = http.get("/competitors/c07/prices").json()
        unknown = [http.get(p) for p in ("/sources/nope", "/competitors/c99/prices", "/x")]

    assert all(s["name"] == n and s["title"] and s["body"] for n, s in sources.items())
    assert len(competitors) == 30 and competitors[6]["id"] == "c07"
    assert [p["sku"] for p in prices["prices"]] == ["sku-1", "sku-2", "sku-3"]
    assert prices["prices"] == prices_again["prices"]
    assert [r.status_code for r in unknown] == [404, 404, 404]
    assert all("error" in r.json() for r in unknown)


def test_web_fails_a_path_as_told_and_counts_requests(tmp_path: Path) -> None:
    path = "/competitors/c07/prices"
    with WebSandbox(log_path=tmp_path / "web.jsonl") as web, client(web.url) as http:
        http.post("/_control/fail", json={"path": path, "status": 500, "times": 2})
        flaky = [http.get(path).status_code for _ in range(3)]
        http.post("/_control/fail", json={"path": path, "status": 404, "times": -1})
        gone = [http.get(path).status_code for _ in range(3)]
        http.post("/_control/reset")
        back = http.get(path).status_code
        other = http.get("/competitors/c08/prices").status_code
        stats = http.get("/_control/stats").json()

    assert flaky == [500, 500, 200]
    assert gone == [404, 404, 404]
    assert (back, other) == (200, 200)
    assert stats == {"requests": {path: 7, "/competitors/c08/prices": 1}}


# -- messages API ------------------------------------------------------------------------------


def test_messages_api_speaks_to_the_real_sdk(messages: MessagesSandbox) -> None:
    with model(messages) as llm:
        call = llm.messages.create(
            model="claude-test",
            max_tokens=100,
            messages=[{"role": "user", "content": "Write the nightly report."}],
            tools=[FETCH_TOOL],
        )
        tool_use = call.content[0]
        assert isinstance(tool_use, anthropic.types.ToolUseBlock)
        result = {"type": "tool_result", "tool_use_id": tool_use.id, "content": "2 SEV3s"}
        history: Any = [
            {"role": "user", "content": "Write the nightly report."},
            {"role": "assistant", "content": [tool_use.model_dump()]},
            {"role": "user", "content": [result]},
        ]
        done = llm.messages.create(
            model="claude-test", max_tokens=100, messages=history, tools=[FETCH_TOOL]
        )

    assert (call.type, call.role, call.model) == ("message", "assistant", "claude-test")
    assert call.stop_reason == "tool_use" and call.stop_sequence is None
    assert (tool_use.name, tool_use.input) == ("fetch_source", {"name": "sandbox"})
    assert tool_use.id.startswith("toolu_")
    assert call.usage.input_tokens > 0 and call.usage.output_tokens > 0
    assert done.stop_reason == "end_turn"
    assert isinstance(done.content[0], anthropic.types.TextBlock)
    assert "2 SEV3s" in done.content[0].text
    assert [e["stop_reason"] for e in read_log(messages.log.path)] == ["tool_use", "end_turn"]


def test_a_request_whose_client_died_before_its_body_is_not_served(
    messages: MessagesSandbox,
) -> None:
    # given a worker killed between sending a request's headers and its body (httpx writes
    # them separately)
    url = httpx.URL(messages.url)
    with socket.create_connection((url.host, url.port), timeout=5) as conn:
        conn.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: sandbox\r\n"
            b"Content-Type: application/json\r\nContent-Length: 120\r\n\r\n"
        )
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1024)  # the server closes the connection
    # then no model call happened: nothing is logged or counted, as with a real API
    assert read_log(messages.log.path) == []
    assert messages.stats()["requests"] == 0


def test_messages_api_faults_raise_the_sdk_errors(messages: MessagesSandbox) -> None:
    expected: list[type[Exception]] = [
        anthropic.RateLimitError,
        anthropic.InternalServerError,  # 529 overloaded
        anthropic.InternalServerError,
        anthropic.BadRequestError,
        anthropic.APITimeoutError,
        anthropic.APIConnectionError,
    ]
    faults: list[int | str] = [429, 529, 500, 400, "timeout", "disconnect"]
    hi: Any = [{"role": "user", "content": "hi"}]
    with client(messages.url) as http:
        queued = http.post("/_control/faults", json={"faults": faults})
        assert queued.json()["faults_queued"] == 6
    with model(messages, timeout=1) as llm:
        for error in expected:
            with pytest.raises(error) as raised:
                llm.messages.create(model="m", max_tokens=100, messages=hi)
            if isinstance(raised.value, anthropic.APIStatusError):
                assert raised.value.body["type"] == "error"  # type: ignore[index]
        overloaded = read_log(messages.log.path)[1]
        reply = llm.messages.create(model="m", max_tokens=100, messages=hi)

    assert reply.stop_reason == "end_turn"
    assert overloaded["status"] == 529
    assert messages.stats() == {
        "requests": 7, "faults_served": 6, "faults_queued": 0, "outage_seconds_left": 0.0,
        "rate_limits": {}, "rate_limited": 0,
    }  # fmt: skip
    assert [e["fault"] for e in read_log(messages.log.path)] == [*faults, None]


def test_messages_api_outage_answers_every_request_with_retry_after_for_a_while(
    messages: MessagesSandbox,
) -> None:
    # given a provider rate-limiting everyone for a minute, asking for 20 s each time
    hi: Any = [{"role": "user", "content": "hi"}]
    with client(messages.url) as http:
        started = http.post("/_control/outage", json={"status": 429, "seconds": 60,
                                                       "retry_after": 20})  # fmt: skip
        assert started.status_code == 200 and started.json()["outage_seconds_left"] > 50
        assert http.post("/_control/outage", json={"status": 400, "seconds": 1}).status_code == 400
    with model(messages, timeout=5) as llm:
        # then every request meanwhile gets 429 with the header, read as the SDK and we read it
        for _ in range(3):
            with pytest.raises(anthropic.RateLimitError) as raised:
                llm.messages.create(model="m", max_tokens=100, messages=hi)
            assert retry_after(raised.value) == 20.0
            assert classify(raised.value).__class__.__name__ == "TemporaryError"
        # and once it is over (0 seconds ends it) the provider answers again
        with client(messages.url) as http:
            ended = http.post("/_control/outage", json={"status": 429, "seconds": 0})
            assert ended.json()["outage_seconds_left"] == 0.0
        reply = llm.messages.create(model="m", max_tokens=100, messages=hi)
    assert reply.stop_reason == "end_turn"
    assert [e["status"] for e in read_log(messages.log.path)] == [429, 429, 429, 200]


def test_retry_after_reads_milliseconds_seconds_and_dates() -> None:
    def answered(**headers: str) -> httpx.HTTPStatusError:
        request = httpx.Request("POST", "http://model.test/v1/messages")
        response = httpx.Response(529, headers=headers, request=request)
        return httpx.HTTPStatusError("overloaded", request=request, response=response)

    assert retry_after(answered(**{"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    assert retry_after(answered(**{"retry-after": "20"})) == 20.0
    later = formatdate(time.time() + 30, usegmt=True)
    assert 25 < (retry_after(answered(**{"retry-after": later})) or 0) <= 30
    assert retry_after(answered()) is None
    assert retry_after(answered(**{"retry-after": "soon"})) is None
    assert retry_after(ValueError("no response")) is None


def test_messages_api_rejects_a_tool_use_without_its_result(messages: MessagesSandbox) -> None:
    broken: Any = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "fetch_source", "input": {}}],
        },
        {"role": "user", "content": "and?"},
    ]
    with model(messages) as llm, pytest.raises(anthropic.BadRequestError, match="toolu_1"):
        llm.messages.create(model="m", max_tokens=100, messages=broken)


def test_messages_api_uses_a_scripted_responder_with_latency(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    def responder(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return text_reply(f"reply {len(seen)}")

    with (
        MessagesSandbox(responder=responder, latency_seconds=0.2, log_path=tmp_path / "m") as srv,
        model(srv) as llm,
    ):
        began = time.monotonic()
        reply = llm.messages.create(
            model="m",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
            metadata={"user_id": "run-42"},
        )
        took = time.monotonic() - began

    assert reply.content[0].type == "text" and reply.content[0].text == "reply 1"
    assert seen[0]["metadata"] == {"user_id": "run-42"}
    assert took >= 0.2
    assert srv.log.entries()[0]["user_id"] == "run-42"


# -- all at once -------------------------------------------------------------------------------


def test_start_all_describes_every_service(tmp_path: Path) -> None:
    with start_all(tmp_path) as sandboxes:
        manifest = json.loads(write_manifest(sandboxes, tmp_path).read_text())
        with client(manifest["email"]) as http:
            http.post("/emails", json=EMAIL).raise_for_status()

    assert set(manifest) == {"web", "email", "pricing", "githost", "messages", "git_url", "logs"}
    assert all(manifest[name].startswith("http://127.0.0.1:") for name in manifest["logs"])
    assert len(read_log(manifest["logs"]["email"])) == 1


def test_sandbox_process_serves_until_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen(
        [sys.executable, "-m", "pipeline.sandbox", "--dir", str(tmp_path)],
        env=env,
        stderr=subprocess.PIPE,
    ) as proc:
        deadline = time.monotonic() + 10
        while not (tmp_path / "sandbox.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        urls = json.loads((tmp_path / "sandbox.json").read_text())
        with client(urls["githost"]) as http:
            pull = {"title": "t", "head": "main", "base": "main"}  # the seeded repository's
            http.post("/repos/acme/shop/pulls", json=pull).raise_for_status()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0

    assert len(read_log(urls["logs"]["githost"])) == 1
