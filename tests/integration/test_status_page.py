"""The status page: sign in with your own token (or through a trusted proxy), see runs,
batches and timelines, and decide pending approvals once in your own name, behind a session
cookie and a CSRF token. One test drives headless Chromium."""

from __future__ import annotations

import html
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from models import Action, ActionState, Batch, JournalEntry, Run, RunStatus
from pipeline.api.tokens import revoke_token
from pipeline.db import transaction
from pipeline.engine import artifacts
from pipeline.runs.start import start_run
from pipeline.sandbox.pricing import PricingSandbox
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import get_settings
from pipeline.testing.agent_run import start_synthesis
from tests.integration.api_fixtures import (
    BUG,
    PR_KEY,
    TOKEN,
    action_row,
    as_seen,
    audit_trail,
    client,
    live_server,
    make_app,
    park_on_approval,
    person_token,
    submit_login,
)
from tests.integration.conftest import ProcessFactory
from tests.support import run_row, wait_for_status

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - CI installs it; locally the browser test skips
    sync_playwright = None  # type: ignore[assignment]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
ACTION_PAGE = f"/ui/actions/{quote(PR_KEY, safe='')}"


@pytest.fixture
def page_client(db_url: str) -> TestClient:
    return client()


def sign_in(api: TestClient, who: str = "alice@example.com") -> str:
    """Sign in with a token of `who`'s own; returns the CSRF token the pages carry."""
    token = person_token(who)
    response = submit_login(api, {"token": token}, follow_redirects=False)
    assert response.status_code == 303, response.text
    dashboard = api.get("/ui")
    match = re.search(r'name="csrf" value="([^"]+)"', dashboard.text)
    assert match, "the page carries a CSRF token"
    return match.group(1)


def test_signing_in_sets_a_strict_http_only_cookie_without_the_token(
    page_client: TestClient,
) -> None:
    # an anonymous visitor is sent to the sign-in form
    anonymous = page_client.get("/ui", follow_redirects=False)
    assert (anonymous.status_code, anonymous.headers["location"]) == (303, "/ui/login")
    # a wrong token is refused, with no cookie
    wrong = submit_login(page_client, {"token": "nst_guess-guess-guess-1"})
    assert wrong.status_code == 401 and "unknown or revoked" in wrong.text
    assert "nightshift_session" not in wrong.cookies
    # the shared API token names nobody, so it signs nobody in (finding 2: "who" was typed)
    shared = submit_login(page_client, {"who": "alice@example.com", "token": TOKEN})
    assert shared.status_code == 401 and "your own token" in shared.text
    assert "nightshift_session" not in shared.cookies
    # a person's own token sets a session cookie that scripts cannot read nor sites send
    mine = person_token("alice@example.com")
    ok = submit_login(page_client, {"token": mine}, follow_redirects=False)
    [cookie] = [c for c in ok.headers.get_list("set-cookie") if c.startswith("nightshift_session=")]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert mine not in cookie
    # the pages are not framable and run no inline script
    page = page_client.get("/ui")
    assert page.status_code == 200 and "alice@example.com" in page.text
    assert page.headers["x-frame-options"] == "DENY"
    assert "script-src 'self'" in page.headers["content-security-policy"]
    # a forged cookie is no session
    page_client.cookies.clear()
    page_client.cookies.set("nightshift_session", "e30.forged")
    assert page_client.get("/ui", follow_redirects=False).status_code == 303


def test_a_decision_without_the_session_csrf_token_is_refused(page_client: TestClient) -> None:
    park_on_approval()
    csrf = sign_in(page_client)
    for token in ("", "0" * 64, csrf[:-1] + ("0" if csrf[-1] != "0" else "1")):
        response = page_client.post(ACTION_PAGE, data={"decision": "approve", "csrf": token})
        assert response.status_code == 403 and "stale" in response.text
    # a CSRF token from another person's session does not work either
    other = client()
    sign_in(other, who="bob@example.com")
    stolen = other.post(ACTION_PAGE, data={"decision": "approve", "csrf": csrf})
    assert stolen.status_code == 403
    assert action_row().state == ActionState.PENDING_APPROVAL


def test_the_page_decides_once_as_the_signed_in_person(page_client: TestClient) -> None:
    # given a pending approval on the overview
    run_id = park_on_approval()
    csrf = sign_in(page_client)
    overview = page_client.get("/ui").text
    assert PR_KEY in overview and 'value="approve"' in overview

    # when the person approves it (and the form is sent twice)
    form = {"decision": "approve", "csrf": csrf, "note": "ship it", **as_seen()}
    first = page_client.post(ACTION_PAGE, data=form, follow_redirects=False)
    again = page_client.post(ACTION_PAGE, data=form, follow_redirects=False)

    # then it is decided once, in their name, the page confirms it, and the run is woken
    assert (first.status_code, first.headers["location"]) == (303, f"{ACTION_PAGE}?decided=approve")
    assert (
        "You approved it. The run goes on and sends it now"
        in page_client.get(first.headers["location"]).text
    )
    assert again.headers["location"] == f"{ACTION_PAGE}?repeated=1"
    action = action_row()
    assert (action.state, action.decided_by, action.note) == (
        ActionState.INTENDED,
        "alice@example.com",
        "ship it",
    )
    assert run_row(run_id).status == RunStatus.RUNNING
    assert "already been decided" in page_client.get(again.headers["location"]).text
    # and rejecting it afterwards is refused on the page
    late = page_client.post(ACTION_PAGE, data={"decision": "reject", "csrf": csrf, **as_seen()})
    assert late.status_code == 409 and "already decided" in late.text


def test_runs_batches_and_a_timeline_are_shown(page_client: TestClient) -> None:
    # given a batch with a run that has journaled a model call and a tool call
    run_id = park_on_approval()
    with transaction() as session:
        session.add(Batch(id="nightly:2026-11-29", name="nightly", params={}))
        session.flush()
        session.execute(update(Run).where(Run.id == run_id).values(batch_id="nightly:2026-11-29"))
        reply = {"content": [{"type": "tool_use", "id": "t1", "name": "draft_fix",
                              "input": {"issue": 7}}], "usage": {"input_tokens": 9}}  # fmt: skip
        result = {"tool_use_id": "t1", "name": "draft_fix", "content": "<b>diff</b>"}
        session.add(JournalEntry(run_id=run_id, key="model:0", step=0, step_name="ask_model",
                                 payload=reply))  # fmt: skip
        session.add(JournalEntry(run_id=run_id, key="tool:t1", step=0, step_name="draft_fix",
                                 payload=result))  # fmt: skip
    sign_in(page_client)

    overview = page_client.get("/ui").text
    assert "nightly:2026-11-29" in overview and str(run_id)[:8] in overview
    timeline = page_client.get(f"/ui/runs/{run_id}").text
    assert "asks draft_fix" in timeline and "model [9/0 tok]" in timeline
    assert "&lt;b&gt;diff&lt;/b&gt;" in timeline  # escaped, never markup
    assert "waiting for a decision" in timeline and 'value="reject"' in timeline
    assert "fence" not in timeline
    batch = page_client.get("/ui/batches/nightly:2026-11-29").text
    assert "0/1" in batch and str(run_id)[:8] in batch
    missing = page_client.get(f"/ui/runs/{uuid.uuid4()}")
    assert missing.status_code == 404 and "no run has id" in missing.text


def test_a_runs_page_shows_attempts_only_when_one_failed(page_client: TestClient) -> None:
    # given a run claimed three times, once per step, that never crashed
    run_id = park_on_approval()
    with transaction() as session:
        session.execute(update(Run).where(Run.id == run_id).values(attempt=3))
    sign_in(page_client)
    # then its page says nothing of attempts
    page = page_client.get(f"/ui/runs/{run_id}").text
    assert "<dt>attempts</dt>" not in page and "failed attempts" not in page
    # and once an attempt of its step 2 failed, it says so, with the claims in all
    with transaction() as session:
        session.execute(
            update(Run).where(Run.id == run_id).values(failed_step=2, failed_attempts=1)
        )
    page = page_client.get(f"/ui/runs/{run_id}").text
    assert "<dt>failed attempts</dt>" in page and "1 of step 2 (3 claims in all)" in page


def test_an_artifact_is_shown_rendered_and_escaped_and_a_long_input_collapsed(
    page_client: TestClient,
) -> None:
    # given a run with a long input, a two-line tool result and a markdown artifact a model wrote
    run_id = park_on_approval()
    long_input = {**BUG, "children": [{"competitor": f"c{n:02d}"} for n in range(30)]}
    document = (
        "# Report\n\nAll **fine**. <script>alert(1)</script>\n\n[click](javascript:alert(1))\n"
    )
    with transaction() as session:
        artifacts.store_txn(
            session, artifacts.prepare(run_id, "report", document, "text/markdown", 10**6)
        )
        session.execute(update(Run).where(Run.id == run_id).values(input=long_input))
        result = {"tool_use_id": "t1", "name": "draft_fix", "content": "line one\nline two"}
        session.add(JournalEntry(run_id=run_id, key="tool:t1", step=0, step_name="draft_fix",
                                 payload=result))  # fmt: skip
    sign_in(page_client)

    # then the timeline entry holds the whole text with its newline, the input is folded
    timeline = page_client.get(f"/ui/runs/{run_id}").text
    assert '<pre class="detail">line one\nline two</pre>' in timeline
    assert '<details class="long" id="input">' in timeline
    link = re.search(rf'href="(/ui/runs/{run_id}/artifacts/\d+)">report</a>', timeline)
    assert link, "the artifact is a link"

    # and the artifact renders as markdown with the model's HTML escaped and no script link
    shown = page_client.get(link.group(1)).text
    assert "<h1>Report</h1>" in shown and "<strong>fine</strong>" in shown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown and "<script>alert" not in shown
    assert 'href="javascript:' not in shown
    assert page_client.get(f"/ui/runs/{run_id}/artifacts/999").status_code == 404


UNKNOWN_KEY = "patch:acme/shop:patch/issue-8"


def test_the_needs_attention_view_says_what_to_decide_and_takes_the_decision(
    page_client: TestClient,
) -> None:
    # given a pending approval and a send whose outcome is unknown
    park_on_approval()
    unknown_run = park_on_approval(key=UNKNOWN_KEY, bug={**BUG, "issue": 8})
    with transaction() as session:
        session.execute(
            update(Action)
            .where(Action.idempotency_key == UNKNOWN_KEY)
            .values(state=ActionState.OUTCOME_UNKNOWN, attempts=1)
        )
        session.execute(
            update(Run)
            .where(Run.id == unknown_run)
            .values(
                status=RunStatus.NEEDS_ATTENTION, waiting_on="action:patch:acme/shop:patch/issue-8"
            )
        )
    csrf = sign_in(page_client)

    # then the header counts both and the view asks for each decision in words
    overview = page_client.get("/ui").text
    assert re.search(r'needs attention <span class="badge">2</span>', overview)
    view = page_client.get("/ui/attention").text
    assert "Approve or reject" in view and "Did it happen?" in view
    assert 'value="approve"' in view and 'value="did_not_happen"' in view
    assert "patch/issue-7" in view and "Check the service" in view

    # when the person says the unknown one did not happen
    key = quote(UNKNOWN_KEY, safe="")
    form = {"decision": "did_not_happen", "csrf": csrf}
    answered = page_client.post(f"/ui/actions/{key}", data=form, follow_redirects=False)

    # then the page confirms it, and only the approval is left to decide
    assert answered.headers["location"] == f"/ui/actions/{key}?decided=did_not_happen"
    confirmed = page_client.get(answered.headers["location"]).text
    assert "Recorded: it did not happen. The run sends it again now, once." in confirmed
    assert "did not happen, sending again" in confirmed
    assert re.search(r'needs attention <span class="badge">1</span>', page_client.get("/ui").text)


# -- in a real browser ----------------------------------------------------------------------


def _need(ok: bool, what: str) -> None:
    """Skip locally when the browser is missing; in CI, fail."""
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is required in CI")
        pytest.skip(f"{what} is not installed")


# The pricing synthesis as the fan-out starts it once a night's children are done: three
# competitors quote sku-2 at a median of 52.00, ours is 49.00, so it proposes one change.
NIGHT = "competitor-monitor:2026-11-30T07:00:00+00:00"
QUOTES = {"c01": 51.0, "c02": 52.0, "c03": 53.5}
SYNTHESIS_INPUT = {
    "batch": NIGHT,
    "children": [
        {"item": {"competitor": c, "name": f"Competitor {c}"}, "status": "succeeded",
         "reason": "completed", "error": None,
         "result": json.dumps({"ok": True, "currency": "USD", "prices": {"sku-2": price}})}
        for c, price in QUOTES.items()
    ],
}  # fmt: skip
PRICE_KEY = f"price_synthesis:sku-2:{NIGHT}"


@pytest.fixture
def pricing(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PricingSandbox]:
    sandbox = PricingSandbox(log_path=tmp_path / "pricing.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_PRICING_URL", sandbox.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the scripted model answers
    get_settings.cache_clear()
    yield sandbox
    sandbox.stop()


def test_a_person_approves_a_price_change_in_the_browser_and_it_happens_once(
    pricing: PricingSandbox, processes: ProcessFactory
) -> None:
    _need(sync_playwright is not None, "the playwright package")
    _need(Path(CHROMIUM).exists(), CHROMIUM)
    assert sync_playwright is not None

    # given a worker that names the pricing manager as the approver of price changes, and the
    # night's price synthesis waiting for its change to be approved
    processes("worker", env={"NIGHTSHIFT_APPROVERS_SET_PRICE": "pricing.manager@example.com"})
    run_id = start_synthesis("price_synthesis", SYNTHESIS_INPUT, NIGHT)
    parked = wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=60)
    assert parked.waiting_on == f"approval:{PRICE_KEY}"
    assert pricing.changes() == []
    action_page = f"/ui/actions/{quote(PRICE_KEY, safe='')}"

    with live_server(make_app()) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            # when the pricing manager opens the page, signs in and approves the change
            page.goto(f"{base}/ui")
            assert page.url == f"{base}/ui/login"
            page.fill("input[name=token]", person_token("pricing.manager@example.com"))
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/ui")
            row = page.locator(f'tr.approval[data-key="{PRICE_KEY}"]')
            assert "set_price" in row.inner_text() and "52.0" in row.inner_text()
            row.locator("input[name=note]").fill("matches the market")
            row.locator("button[value=approve]").click()
            # then the page confirms the decision in words, in their name
            page.wait_for_url(f"{base}{action_page}?decided=approve")
            confirmation = page.locator("#confirmation").inner_text()
            assert confirmation == "You approved it. The run goes on and sends it now, once."
            decided = page.locator("#decision").inner_text()
            assert "approve by pricing.manager@example.com" in decided

            # and the run finishes and shows the change as done
            wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=60)
            page.goto(f"{base}{action_page}")
            assert page.locator("#state").inner_text() == "done"
            # and nothing waits for approval any more
            page.goto(f"{base}/ui")
            assert page.locator("tr.approval").count() == 0

            # when they open the run and expand the step that proposed the change
            page.goto(f"{base}/ui/runs/{str(run_id)[:8]}")
            entry = page.locator("li.entry", has_text="asks set_price").first
            detail = entry.locator("pre.detail")
            assert not detail.is_visible()
            entry.locator("summary").click()
            # then its whole text shows, over several lines
            assert detail.is_visible()
            shown = detail.inner_text()
            assert '"sku": "sku-2"' in shown and "\n" in shown and "\\n" not in shown

            # when they open the summary artifact
            page.locator("ul.artifacts a", has_text="summary").click()
            # then it is rendered from markdown, not shown as a path in raw JSON
            heading = page.locator("#artifact h1").inner_text()
            assert heading.startswith("Competitor prices, batch")
            assert "sku-2" in page.locator("#artifact").inner_text()
        finally:
            browser.close()

    # and the price changed exactly once, to the market median
    assert len(pricing.changes(PRICE_KEY)) == 1
    assert len(pricing.changes()) == 1
    assert pricing.price("sku-2")["price"] == 52.0  # type: ignore[index]
    action = action_row(PRICE_KEY)
    assert (action.state, action.attempts, action.decided_by, action.note) == (
        ActionState.CONFIRMED,
        1,
        "pricing.manager@example.com",
        "matches the market",
    )
    assert "sku-2 set to 52.00" in run_row(run_id).result["text"]


def test_a_revoked_token_ends_its_sessions_at_once(page_client: TestClient) -> None:
    park_on_approval()
    token = person_token("alice@example.com")
    assert submit_login(page_client, {"token": token}).status_code == 200
    assert page_client.get("/ui", follow_redirects=False).status_code == 200
    revoke_token(token[:12], by="test")
    assert page_client.get("/ui", follow_redirects=False).status_code == 303


def test_a_trusted_proxy_signs_people_in_only_when_switched_on(db_url: str) -> None:
    park_on_approval(approvers=("alice@example.com",))
    who = {"X-Forwarded-Email": "alice@example.com"}
    # off by default: the header means nothing
    plain = client(headers=who)
    assert plain.get("/ui", follow_redirects=True).url.path == "/ui/login"
    assert plain.get("/runs").status_code == 401
    # switched on, but the request does not come from a trusted proxy address
    untrusted = client(headers=who, identity_header="X-Forwarded-Email")
    assert untrusted.get("/runs").status_code == 401
    # switched on and from the proxy (the test client's address): signed in as the header says
    proxied = client(
        headers=who,
        identity_header="X-Forwarded-Email",
        trusted_proxies=frozenset({"testclient"}),
    )
    assert proxied.get("/runs").status_code == 200
    page = proxied.get("/ui")
    assert page.url.path == "/ui" and "alice@example.com" in page.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    form = {"decision": "approve", "csrf": csrf.group(1), **as_seen()}
    decided = proxied.post(ACTION_PAGE, data=form)
    assert decided.status_code == 200
    assert action_row().decided_by == "alice@example.com"
    # and when the proxy says someone else, the old session no longer counts
    proxied.headers["X-Forwarded-Email"] = "bob@example.com"
    assert "bob@example.com" in proxied.get("/ui").text


@pytest.fixture
def web(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WebSandbox]:
    sandbox = WebSandbox(log_path=tmp_path / "web.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_WEB_URL", sandbox.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the scripted model answers
    get_settings.cache_clear()
    yield sandbox
    sandbox.stop()


def test_a_runs_timeline_grows_live_in_the_browser_without_a_reload(
    web: WebSandbox, processes: ProcessFactory
) -> None:
    _need(sync_playwright is not None, "the playwright package")
    _need(Path(CHROMIUM).exists(), CHROMIUM)
    assert sync_playwright is not None

    # given a follow-up run that has checked the deploys and waits 10 seconds to check again
    processes("worker")
    processes("beat", beat=True)
    run_id = start_run("follow_up", {"after_seconds": 10}).run_id
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=30)

    with live_server(make_app()) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{base}/ui/login")
            page.fill("input[name=token]", person_token("ops@example.com"))
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/ui")
            # when someone opens the run's page while it waits
            page.goto(f"{base}/ui/runs/{run_id}")
            page.evaluate("window.sameDocument = true")
            before = page.locator("li.entry").count()
            status = page.locator("#run-status").inner_text()
            assert status.startswith("waiting"), f"the run moved on too early: {status}"
            page.wait_for_selector("body[data-live=on]", state="attached")

            # then, as the timer falls due and the run goes on, the page follows it
            page.wait_for_selector("body[data-live=ended]", state="attached", timeout=30_000)
            assert page.evaluate("window.sameDocument") is True  # never reloaded
            live_keys = page.locator("li.entry").evaluate_all("es => es.map(e => e.dataset.key)")
            assert len(live_keys) > before
            assert page.locator("#run-status").inner_text().startswith("succeeded")
            assert "Checked the deploys" in page.locator("#run-result").inner_text()
            # and it shows what a fresh load shows, each entry once
            page.reload()
            loaded = page.locator("li.entry").evaluate_all("es => es.map(e => e.dataset.key)")
            assert live_keys == loaded and len(set(loaded)) == len(loaded)
        finally:
            browser.close()
    assert run_row(run_id).status == RunStatus.SUCCEEDED


def test_a_failed_action_is_retried_from_the_page_in_the_persons_name(
    page_client: TestClient,
) -> None:
    park_on_approval()
    with transaction() as session:
        session.execute(
            update(Action)
            .where(Action.idempotency_key == PR_KEY)
            .values(state=ActionState.FAILED, error="HTTP 422: branch protected")
        )
    csrf = sign_in(page_client, who="oncall@example.com")
    page = page_client.get(ACTION_PAGE).text
    assert 'value="retry"' in page and "branch protected" in page
    retried = page_client.post(ACTION_PAGE, data={"decision": "retry", "csrf": csrf})
    assert retried.status_code == 200  # back on the action page
    assert action_row().state == ActionState.RELEASED
    [entry] = audit_trail()
    assert (entry.event, entry.by) == ("retry", "oncall@example.com")
    assert entry.via.startswith("status page, token nst_")
    assert "oncall@example.com" in page_client.get(ACTION_PAGE).text  # the audit trail shows
    again = page_client.post(ACTION_PAGE, data={"decision": "retry", "csrf": csrf})
    assert again.status_code == 409 and "only a failed action can be retried" in again.text


def test_an_approval_of_an_action_that_changed_since_the_page_showed_it_is_refused(
    page_client: TestClient,
) -> None:
    park_on_approval()
    csrf = sign_in(page_client)
    shown = action_row()
    form = {"decision": "approve", "csrf": csrf, "run_id": str(shown.run_id)}
    stale = page_client.post(ACTION_PAGE, data={**form, "args_hash": "0" * 64})
    assert stale.status_code == 409 and "not the one you saw" in stale.text
    assert action_row().state == ActionState.PENDING_APPROVAL
    ok = page_client.post(
        ACTION_PAGE, data={**form, "args_hash": shown.args_hash or ""}, follow_redirects=False
    )
    assert ok.status_code == 303 and action_row().state == ActionState.INTENDED


def test_a_decision_from_a_form_that_names_no_run_or_arguments_is_refused(
    page_client: TestClient,
) -> None:
    # given a pending approval and a signed-in approver
    park_on_approval()
    csrf = sign_in(page_client)
    seen = as_seen()
    # when a form approves or rejects it with a blank run_id or args_hash, or neither
    forms = [
        {"decision": "approve"},
        {"decision": "reject", "run_id": "", "args_hash": ""},
        {"decision": "approve", "run_id": seen["run_id"], "args_hash": ""},
        {"decision": "approve", "run_id": "", "args_hash": seen["args_hash"]},
    ]
    answers = [page_client.post(ACTION_PAGE, data={**form, "csrf": csrf}) for form in forms]
    # then each is refused as the webhook refuses it (422), in one line naming both fields
    for answer in answers:
        assert answer.status_code == 422, answer.text
        error = re.search(r'<p class="error" role="alert">([^<]*)</p>', answer.text)
        said = html.unescape(error.group(1)) if error else answer.text
        assert "'run_id'" in said and "'args_hash'" in said and "\n" not in said
    # and nothing was decided: the action still waits for an approval as seen
    assert action_row().state == ActionState.PENDING_APPROVAL
    bad_hash = {"decision": "approve", "csrf": csrf, "run_id": seen["run_id"], "args_hash": "x"}
    assert page_client.post(ACTION_PAGE, data=bad_hash).status_code == 422
