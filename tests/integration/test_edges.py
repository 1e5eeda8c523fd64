"""Issue 26's reproductions against a live API (uvicorn on a socket, configured as `nightshift
api` configures it): what gave way at the edges now refuses."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import time
import uuid
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import update

from models import ActionAudit, ActionState, Batch, Run, RunStatus
from pipeline.api.sessions import COOKIE
from pipeline.api.sse import RECHECK
from pipeline.api.tokens import create_token, revoke_token
from pipeline.db import transaction
from tests.integration.api_fixtures import (
    AUTH,
    PR_KEY,
    TOKEN,
    action_row,
    as_seen,
    bearer,
    count,
    live_server,
    make_app,
    park_on_approval,
    person_token,
    signed,
    submit_login,
)
from tests.support import run_row

WHO = {"X-Forwarded-Email": "reviewer@example.com"}
ACTION = f"/ui/actions/{quote(PR_KEY, safe='')}"


def test_a_spoofed_forwarded_for_does_not_pass_for_the_identity_proxy(db_url: str) -> None:
    # given an API that believes the identity header from 10.9.9.9 only
    app = make_app(identity_header="X-Forwarded-Email", trusted_proxies=frozenset({"10.9.9.9"}))
    with live_server(app) as base:
        # when a local client claims to be forwarded by that proxy
        spoofed = httpx.get(f"{base}/runs", headers={**WHO, "X-Forwarded-For": "10.9.9.9"})
        plain = httpx.get(f"{base}/runs", headers=WHO)
    # then the socket's address counts, not the header: no identity
    assert spoofed.status_code == 401, spoofed.text
    assert plain.status_code == 401


def test_a_forwarded_chain_counts_only_through_the_listed_proxies(db_url: str) -> None:
    # given a load balancer on 127.0.0.1 in front, listed as a proxy whose X-Forwarded-For holds
    app = make_app(
        identity_header="X-Forwarded-Email",
        trusted_proxies=frozenset({"10.9.9.9"}),
        forwarded_allow_ips=frozenset({"127.0.0.1"}),
    )
    with live_server(app) as base:
        # when it forwards the identity proxy's request, the proxy's address is the client's
        through = httpx.get(f"{base}/runs", headers={**WHO, "X-Forwarded-For": "10.9.9.9"})
        # and an address the client put further left, before the identity proxy's, is not
        forged = {**WHO, "X-Forwarded-For": "10.9.9.9, 192.0.2.7"}
        past_it = httpx.get(f"{base}/runs", headers=forged)
    assert through.status_code == 200, through.text
    assert past_it.status_code == 401


def _old_style_session(who: str, token_id: uuid.UUID) -> str:
    """A cookie as the page signed them before: HMAC(the shared API token, a constant)."""
    key = hmac.digest(TOKEN.encode(), b"nightshift status page sessions", "sha256")
    claims = {"who": who, "via": "status page, token x", "tid": str(token_id),
              "iat": int(time.time()), "nonce": "n"}  # fmt: skip
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    mac = hmac.new(key, f"session.{payload}".encode(), hashlib.sha256).hexdigest()
    return f"{payload}.{mac}"


def test_the_api_token_cannot_mint_a_status_page_session(db_url: str) -> None:
    # given a reviewer's token whose id an API-token holder knows (tokens list prints it)
    park_on_approval(approvers=("reviewer@example.com",))
    reviewer = create_token("reviewer@example.com", created_by="test")
    with live_server(make_app()) as base:
        # when they sign a session cookie with the shared API token, as the page once did
        forged = _old_style_session("reviewer@example.com", reviewer.id)
        cookies = {COOKIE: forged}
        page = httpx.get(f"{base}/ui", cookies=cookies, follow_redirects=False)
        # then it is no session: the page sends them to sign in, and nothing is decided
        decided = httpx.post(
            f"{base}{ACTION}", cookies=cookies, data={"decision": "approve", "csrf": "x"},
            follow_redirects=False,
        )  # fmt: skip
    assert (page.status_code, page.headers["location"]) == (303, "/ui/login")
    assert decided.status_code == 303
    assert action_row().state == ActionState.PENDING_APPROVAL


def test_signing_out_ends_the_session_on_the_server(db_url: str) -> None:
    with live_server(make_app()) as base, httpx.Client(base_url=base) as browser:
        # given a person signed in
        signed_in = submit_login(browser, {"token": person_token()}, follow_redirects=False)
        assert signed_in.status_code == 303, signed_in.text
        old_cookie = browser.cookies[COOKIE]
        before = httpx.get(f"{base}/ui", cookies={COOKIE: old_cookie}, follow_redirects=False)
        assert before.status_code == 200
        csrf = re.search(r'name="csrf" value="([^"]+)"', browser.get("/ui").text)
        assert csrf is not None
        # when they sign out
        assert browser.post("/ui/logout", data={"csrf": csrf.group(1)}).status_code == 303
        # then the cookie they had (kept by someone, say) opens nothing any more
        again = httpx.get(f"{base}/ui", cookies={COOKIE: old_cookie}, follow_redirects=False)
    assert again.status_code == 303


def test_another_site_cannot_sign_a_browser_in(db_url: str) -> None:
    # given an attacker's own valid token, posted by their page to the status page's sign-in
    attacker = person_token("mallory@example.com")
    with live_server(make_app()) as base:
        posted = httpx.post(
            f"{base}/ui/login", data={"token": attacker},
            headers={"Origin": "https://evil.example"}, follow_redirects=False,
        )  # fmt: skip
    # then it is refused as a stale form, and no session is set
    assert posted.status_code == 403, posted.text
    assert COOKIE not in posted.cookies


def test_a_signed_approval_sent_again_with_its_bearer_spelled_otherwise_is_a_replay(
    db_url: str,
) -> None:
    # given an approval that was accepted with Alice's token
    park_on_approval()
    token = person_token("alice@example.com")
    path = f"/approvals/{PR_KEY}"
    request = signed(path, {"decision": "approve", **as_seen()}, token=token)
    with live_server(make_app()) as base:
        assert httpx.post(f"{base}{path}", **request).status_code == 200
        # when the same signed request comes again with the scheme or spacing changed
        for spelled in (f"bearer {token}", f"BEARER {token}", f"Bearer  {token}"):
            headers = {**request["headers"], "Authorization": spelled}
            again = httpx.post(f"{base}{path}", content=request["content"], headers=headers)
            # then each is the replay it is
            assert again.status_code == 401, (spelled, again.text)
            assert "already received" in again.json()["error"]
    assert count(ActionAudit) == 1


def test_revoking_a_token_closes_its_open_event_streams_within_seconds(db_url: str) -> None:
    # given a stream of a run that will not end soon, opened with Alice's token
    run_id = park_on_approval()
    token = person_token("alice@example.com")
    with live_server(make_app()) as base:
        url = f"{base}/runs/{run_id}/events"
        with httpx.stream("GET", url, headers=bearer(token), timeout=30) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            assert next(lines).startswith("retry:")
            # when the token is revoked
            revoke_token(token[:12], by="test")
            revoked_at = time.monotonic()
            # then the stream ends within seconds (it would otherwise run until the run ends)
            for _ in lines:
                pass
            closed_after = time.monotonic() - revoked_at
        # and reconnecting is refused
        again = httpx.get(url, headers=bearer(token))
    assert closed_after < 2 * RECHECK + 2, closed_after
    assert again.status_code == 401


# -- 9: input PostgreSQL cannot store, or Python cannot parse, is a 4xx with a quiet log ------

MARK = "mark-5f1c"
"""In every bad value below: the log must not quote it."""


def _start_body(title: str) -> bytes:
    """POST /runs's body for a Patch run (whose issue title is free text) as the bytes a
    client sends, `title` spliced in raw (a JSON escape in it stays one)."""
    patch = b'{"agent": "patch", "input": {"issue": 7, "repo": "acme/shop", "title": "%s"}}'
    return patch % title.encode()


@pytest.mark.parametrize(
    ("title", "said"),
    [(f"\\u0000{MARK}", "NUL (U+0000)"), (f"\\ud800{MARK}", "lone surrogate")],
    ids=["nul", "lone-surrogate"],
)
def test_a_value_postgresql_cannot_store_is_a_422_and_the_log_does_not_quote_it(
    db_url: str, caplog: pytest.LogCaptureFixture, title: str, said: str
) -> None:
    caplog.set_level(logging.DEBUG)
    with live_server(make_app()) as base:
        # when a run's input holds a NUL, or half of a surrogate pair, as a JSON escape
        headers = {**AUTH, "Content-Type": "application/json"}
        started = httpx.post(f"{base}/runs", content=_start_body(title), headers=headers)
        # or a query parameter holds a NUL
        listed = httpx.get(f"{base}/runs", params={"agent": f"\x00{MARK}"}, headers=AUTH)
    # then each is refused with one line saying what, nothing is written, and nothing is logged
    assert started.status_code == 422, started.text
    assert said in started.json()["error"]
    assert listed.status_code == 422 and "NUL (U+0000)" in listed.json()["error"]
    assert count(Run) == 0
    assert MARK not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_signed_event_nested_100_000_deep_is_a_400(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    deep = b"[" * 100_000 + b"]" * 100_000
    body = b'{"event_id": "%s", "payload": {"team": ' % MARK.encode() + deep + b"}}"
    path = "/events/ops-report-request"
    with live_server(make_app()) as base:
        # when a correctly signed event's body is nested 100,000 deep
        answered = httpx.post(f"{base}{path}", **signed(path, body))
        # then it is refused as unreadable, and the server is unhurt
        assert answered.status_code == 400, answered.text
        assert answered.json()["error"] == (
            "the request body is not valid JSON: it is nested too deeply"
        )
        assert httpx.get(f"{base}/healthz").status_code == 200
    assert count(Run) == 0
    assert MARK not in caplog.text and "[[[" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_signed_event_is_judged_after_its_signature(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = b'{"event_id": "e-1", "payload": {"team": "\\u0000%s"}}' % MARK.encode()
    path = "/events/ops-report-request"
    with live_server(make_app()) as base:
        # when an event holding a NUL comes unsigned, and then signed
        unsigned = httpx.post(
            f"{base}{path}", content=body, headers={"Content-Type": "application/json"}
        )
        answered = httpx.post(f"{base}{path}", **signed(path, body))
    # then the unsigned one proves no one, whatever it holds; the signed one cannot be stored
    assert unsigned.status_code == 401, unsigned.text
    assert answered.status_code == 422, answered.text
    assert "NUL (U+0000)" in answered.json()["error"]
    assert count(Run) == 0
    assert MARK not in caplog.text


# -- 10: --insecure-no-auth serves this machine's own clients, not the pages its user visits --


def test_without_auth_a_page_of_another_site_cannot_cancel_a_run(db_url: str) -> None:
    # given an API started with --insecure-no-auth, and a run waiting for approval
    run_id = park_on_approval()
    with live_server(make_app(api_token=None, insecure_no_auth=True)) as base:
        cancel = f"{base}/runs/{run_id}/cancel"
        port = base.rsplit(":", 1)[1]
        # when a page of another site posts to it: as JSON (the browser asks first), as a form,
        # as text, or with no body at all (neither of which a browser asks about)
        foreign = {"Origin": "https://evil.example"}
        tried = {
            "json from another origin": httpx.post(cancel, json={}, headers=foreign),
            "a form": httpx.post(cancel, data={"reason": "cancelled"}),
            "text": httpx.post(cancel, content=b"{}", headers={"Content-Type": "text/plain"}),
            "an empty body": httpx.post(cancel),
            # or its own name, rebound to 127.0.0.1 (DNS rebinding: same origin to the browser)
            "a rebound name": httpx.post(cancel, json={}, headers={"Host": f"evil.example:{port}"}),
        }
        # and a rebound page reads nothing either
        read = httpx.get(f"{base}/runs", headers={"Host": f"evil.example:{port}"})
        # then each is refused, saying why in one line
        statuses = {what: answer.status_code for what, answer in tried.items()}
        assert statuses == {
            "json from another origin": 403,
            "a form": 415,
            "text": 415,
            "an empty body": 415,
            "a rebound name": 403,
        }, {what: answer.text for what, answer in tried.items()}
        assert "evil.example" in tried["a rebound name"].json()["error"]
        assert read.status_code == 403
        assert run_row(run_id).status == RunStatus.WAITING

        # while the local user's own client, by address or by localhost, still may
        assert httpx.get(f"http://localhost:{port}/runs").status_code == 200
        same_origin = {"Origin": base}
        done = httpx.post(cancel, json={"reason": "cancelled"}, headers=same_origin)
    assert done.status_code == 200, done.text
    assert run_row(run_id).status == RunStatus.CANCELLED


def test_without_auth_the_status_page_opens_with_no_sign_in(db_url: str) -> None:
    # given an API started with --insecure-no-auth, and a run waiting for approval
    park_on_approval()
    # when the local user opens /ui in a browser with no session
    with (
        live_server(make_app(api_token=None, insecure_no_auth=True)) as base,
        httpx.Client(base_url=base, follow_redirects=True) as browser,
    ):
        page = browser.get("/ui")
        attention = browser.get("/ui/attention")
    # then the dashboard opens, with no form asking for a token, signed in as nobody
    assert page.status_code == 200 and page.url.path == "/ui", page.text
    assert 'name="token"' not in page.text
    assert attention.status_code == 200 and PR_KEY in attention.text
    # while a server with authentication still asks
    with live_server(make_app()) as base:
        asked = httpx.get(f"{base}/ui", follow_redirects=True)
    assert asked.url.path == "/ui/login" and 'name="token"' in asked.text


# -- 11: the pages name an action's approvers to no one the 403 hides them from --------------


def test_only_an_approver_is_shown_who_the_approvers_are(db_url: str) -> None:
    # given a pull request only Alice and Carol may approve, in a batch
    park_on_approval(approvers=("alice@example.com", "carol@example.com"))
    with transaction() as session:
        session.add(Batch(id="night-1", name="patches"))
        session.execute(update(Run).values(batch_id="night-1"))
    pages = ("/ui", "/ui/attention", ACTION, "/ui/batches/night-1")
    with live_server(make_app()) as base:
        # when Mallory, signed in with her own token, opens every page that lists it
        with httpx.Client(base_url=base) as mallory:
            submit_login(mallory, {"token": person_token("mallory@example.com")})
            seen = {page: mallory.get(page) for page in pages}
        # or asks the API about the batch
        batch = httpx.get(f"{base}/batches/night-1", headers=AUTH)
        # and when Alice does
        with httpx.Client(base_url=base) as alice:
            submit_login(alice, {"token": person_token("alice@example.com")})
            shown_to_alice = alice.get("/ui/attention").text
    # then Mallory sees the action, and that she is not among those who may decide, not who is
    for page, answer in seen.items():
        assert answer.status_code == 200, (page, answer.text)
        assert PR_KEY in answer.text
        assert "alice" not in answer.text and "carol" not in answer.text, page
    assert "you are not one of them" in seen["/ui/attention"].text
    assert PR_KEY in batch.text and "alice" not in batch.text
    # while Alice, who may, sees with whom she shares it
    assert "alice@example.com, carol@example.com" in shown_to_alice
