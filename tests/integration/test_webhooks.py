"""Signed webhooks: approvals decided once in the name of the approver's token, events started
once, and every unsigned, stale, tampered, replayed or re-addressed request refused with 401
before anything is read or written."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from models import ActionState, ExternalEvent, Run, RunStatus
from pipeline.api.tokens import revoke_token
from pipeline.delivery.signatures import signature, verify
from pipeline.errors import BadSignature
from tests.integration.api_fixtures import (
    APPROVAL_SECRET,
    EVENT_SECRET,
    PR_KEY,
    TOKEN,
    action_row,
    as_seen,
    audit_trail,
    bearer,
    client,
    count,
    live_server,
    make_app,
    park_on_approval,
    person_token,
    signed,
)
from tests.support import run_row

APPROVE = {"decision": "approve", "note": "looks right"}
REPORT_REQUEST = {"team": "ops", "date": "2026-11-29"}


@pytest.fixture
def api(db_url: str) -> TestClient:
    """A client whose requests carry Alice's own token."""
    return client(headers=bearer(person_token("alice@example.com")))


def seen(body: dict) -> dict:
    """`body` naming the pending action's run and arguments, as the approver saw them."""
    return {**body, **as_seen()}


def approval(api: TestClient, body: dict | bytes, key: str = PR_KEY, **sign: object):
    path = f"/approvals/{key}"
    return api.post(path, **signed(path, body, **sign))  # type: ignore[arg-type]


def test_the_signature_is_hmac_sha256_over_timestamp_method_path_and_body() -> None:
    body = b'{"decision": "approve"}'
    path = "/approvals/patch:acme/shop:patch/issue-7"
    message = b"1764400000\nPOST\n" + path.encode() + b"\n" + body
    expected = hmac.new(APPROVAL_SECRET.encode(), message, hashlib.sha256).hexdigest()
    assert signature(APPROVAL_SECRET, "1764400000", "POST", path, body) == f"v2={expected}"
    given = f"v2={expected}"
    assert verify(APPROVAL_SECRET, "1764400000", given, "POST", path, body, now=1764400299) == (
        expected
    )
    with pytest.raises(BadSignature, match="in the past"):
        verify(APPROVAL_SECRET, "1764400000", given, "POST", path, body, now=1764400301)
    with pytest.raises(BadSignature, match="does not match"):
        verify(APPROVAL_SECRET, "1764400000", given, "POST", path + "1", body, now=1764400000)
    with pytest.raises(BadSignature, match="control characters"):
        verify(APPROVAL_SECRET, "1764400000", given, "POST", path + "\n", body, now=1764400000)


def test_an_approval_is_decided_once_and_wakes_the_run(api: TestClient) -> None:
    # given a patch run waiting for a person to approve its pull request
    run_id = park_on_approval()

    # when the approval webhook fires, then again (a sender's retry, signed anew)
    first = approval(api, seen(APPROVE))
    again = approval(api, seen(APPROVE), now=time.time() + 1)

    # then the first decided, woke the run, and the repeat returned the first outcome
    assert first.status_code == 200, first.text
    assert first.json() == {
        "action_key": PR_KEY,
        "decision": "approve",
        "decided_by": "alice@example.com",
        "first": True,
        "state": "intended",
        "run_id": str(run_id),
    }
    assert again.status_code == 200
    assert again.json() == {**first.json(), "first": False}
    action = action_row()
    assert (action.state, action.decided_by, action.note) == (
        ActionState.INTENDED,
        "alice@example.com",
        "looks right",
    )
    assert run_row(run_id).status == RunStatus.RUNNING

    # and a conflicting decision afterwards is refused
    late = approval(api, seen({"decision": "reject"}))
    assert late.status_code == 409
    assert "already decided (approve by alice@example.com)" in late.json()["error"]
    assert action_row().state == ActionState.INTENDED


def test_unknown_actions_and_strangers_are_refused(api: TestClient) -> None:
    park_on_approval(approvers=("alice@example.com", "carol@example.com"))
    unknown = approval(api, seen(APPROVE), key="patch:acme/shop:patch/issue-999")
    assert unknown.status_code == 404
    assert "'patch:acme/shop:patch/issue-999'" in unknown.json()["error"]
    # finding 2: a stranger with a valid token of their own is refused, and is not told who
    # may approve
    mallory = person_token("mallory@example.com")
    stranger = approval(api, seen(APPROVE), token=mallory)
    assert stranger.status_code == 403
    error = stranger.json()["error"]
    assert "'mallory@example.com' is not among the approvers" in error
    assert "alice" not in error and "carol" not in error
    assert action_row().state == ActionState.PENDING_APPROVAL
    assert approval(api, seen(APPROVE)).json()["first"] is True


def test_decided_by_is_the_tokens_identity_whatever_the_body_says(api: TestClient) -> None:
    # given an action only Alice may approve, and Mallory's own token
    park_on_approval(approvers=("alice@example.com",))
    mallory = person_token("mallory@example.com")

    # when Mallory signs a body claiming to be Alice, or approves as herself
    claimed = approval(api, seen({**APPROVE, "by": "alice@example.com"}), token=mallory)
    herself = approval(api, seen(APPROVE), token=mallory)

    # then a name in the body is no field of a decision, and Mallory is refused
    assert claimed.status_code == 422 and "'by'" in claimed.json()["error"]
    assert herself.status_code == 403
    assert action_row().state == ActionState.PENDING_APPROVAL

    # and when Alice's token approves, it is Alice's decision
    decided = approval(api, seen(APPROVE))
    assert decided.status_code == 200, decided.text
    assert decided.json()["decided_by"] == "alice@example.com"
    assert action_row().decided_by == "alice@example.com"
    [entry] = audit_trail(PR_KEY)
    assert (entry.event, entry.by) == ("approve", "alice@example.com")
    assert entry.via.startswith("approval webhook, token nst_")


def test_an_approval_without_a_persons_credential_is_refused(api: TestClient) -> None:
    park_on_approval(approvers=("alice@example.com",))
    anonymous = client()
    # no bearer at all, however well signed
    assert approval(anonymous, APPROVE).status_code == 401
    # a revoked token
    bob = person_token("bob@example.com")
    revoke_token(bob[:12], by="test")
    assert approval(anonymous, APPROVE, token=bob).status_code == 401
    # the shared API token names nobody: not an approver of an action that names approvers
    shared = approval(anonymous, seen(APPROVE), token=TOKEN)
    assert shared.status_code == 403
    assert "'NIGHTSHIFT_API_TOKEN' is not among the approvers" in shared.json()["error"]
    assert action_row().state == ActionState.PENDING_APPROVAL


PR_PATH = f"/approvals/{PR_KEY}"


def _tampered(api: TestClient) -> object:
    request = signed(PR_PATH, APPROVE)
    request["content"] = json.dumps({**APPROVE, "note": "and the other one"}).encode()
    return api.post(PR_PATH, **request)


def _unsigned(api: TestClient) -> object:
    return api.post(PR_PATH, json=APPROVE)


def _with(**headers: str):
    def send(api: TestClient) -> object:
        request = signed(PR_PATH, APPROVE)
        request["headers"] = {**request["headers"], **headers}
        return api.post(PR_PATH, **request)

    return send


def _signed_for_another_action(api: TestClient) -> object:
    # finding 1: a captured approval of issue 1 was accepted for the pending issue 7
    return api.post(PR_PATH, **signed("/approvals/patch:acme/shop:patch/issue-1", APPROVE))


def _old_scheme(api: TestClient) -> object:
    raw = json.dumps(APPROVE).encode()
    timestamp = str(int(time.time()))
    mac = hmac.new(APPROVAL_SECRET.encode(), timestamp.encode() + b"." + raw, hashlib.sha256)
    headers = {
        "Content-Type": "application/json",
        "X-Nightshift-Timestamp": timestamp,
        "X-Nightshift-Signature": f"sha256={mac.hexdigest()}",
    }
    return api.post(PR_PATH, content=raw, headers=headers)


REFUSED = {
    "unsigned": (_unsigned, "missing"),
    "signed for another action": (_signed_for_another_action, "does not match"),
    "the event secret": (lambda api: approval(api, APPROVE, secret=EVENT_SECRET), "does not match"),
    "the old scheme (timestamp and body)": (_old_scheme, "old scheme"),
    "another secret": (lambda api: approval(api, APPROVE, secret="x" * 32), "does not match"),
    "a tampered body": (_tampered, "does not match"),
    "six minutes old": (lambda api: approval(api, APPROVE, now=time.time() - 360), "past"),
    "six minutes ahead": (lambda api: approval(api, APPROVE, now=time.time() + 360), "future"),
    "a timestamp that is not a number": (
        _with(**{"X-Nightshift-Timestamp": "yesterday"}),
        "unix seconds",
    ),
    "a signature in another format": (
        _with(**{"X-Nightshift-Signature": "md5=abc"}),
        "does not match",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_bad_signature_is_401_and_changes_nothing(api: TestClient, case: str) -> None:
    park_on_approval()
    send, words = REFUSED[case]
    response = send(api)
    assert response.status_code == 401, response.text  # type: ignore[attr-defined]
    assert words in response.json()["error"]  # type: ignore[attr-defined]
    assert APPROVAL_SECRET not in response.text  # type: ignore[attr-defined]
    assert action_row().state == ActionState.PENDING_APPROVAL


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b'{"decision": "approve", ', 400, "not valid JSON"),
        ({"decision": "maybe"}, 422, "'decision'"),
        ({"decision": "approve", "note": "x" * 2001}, 422, "'note'"),
        ({"decision": "approve", "as": "alice@example.com"}, 422, "'as'"),
        # what the approver saw is no option: a decision names its run and arguments' hash
        ({"decision": "approve", "args_hash": "0" * 64}, 422, "field 'run_id': Field required"),
        ({"decision": "approve", "run_id": str(uuid.uuid4())}, 422, "field 'args_hash'"),
        ({"decision": "approve", "run_id": "run-1", "args_hash": "0" * 64}, 422, "'run_id'"),
        ({"decision": "approve", "run_id": str(uuid.uuid4()), "args_hash": "F00"}, 422, "'args_"),
    ],
)
def test_a_signed_but_malformed_approval_is_refused(
    api: TestClient, body: dict | bytes, status: int, words: str
) -> None:
    park_on_approval()
    response = approval(api, body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert action_row().state == ActionState.PENDING_APPROVAL


def test_a_replayed_signature_is_refused_inside_the_window(api: TestClient) -> None:
    # given an approval that was accepted
    park_on_approval()
    request = signed(PR_PATH, seen(APPROVE))
    assert api.post(PR_PATH, **request).status_code == 200

    # when someone who captured it sends it again, a second later, well inside the window
    replayed = api.post(PR_PATH, **request)

    # then it is refused; a delivery signed anew gets the first outcome, as a retry should
    assert replayed.status_code == 401
    assert "already received" in replayed.json()["error"]
    retried = approval(api, seen(APPROVE), now=time.time() + 1)
    assert (retried.status_code, retried.json()["first"]) == (200, False)


def test_the_replay_cache_is_shared_by_every_api_process(api: TestClient) -> None:
    # two API processes behind a load balancer: two apps, one database
    other = client()
    delivery = {"event_id": "req-7", "payload": REPORT_REQUEST}
    request = signed("/events/ops-report-request", delivery)
    assert api.post("/events/ops-report-request", **request).status_code == 201
    replayed = other.post("/events/ops-report-request", **request)
    assert replayed.status_code == 401 and "already received" in replayed.json()["error"]


def test_each_webhook_is_off_without_its_secret(db_url: str) -> None:
    no_approvals = client(approval_webhook_secret=None)
    response = approval(no_approvals, APPROVE, token=person_token())
    assert response.status_code == 503
    assert "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET" in response.json()["error"]
    no_events = client(event_webhook_secret=None)
    delivery = {"event_id": "e1", "payload": REPORT_REQUEST}
    response = no_events.post("/events/ops-report-request", **signed("/events/x", delivery))
    assert response.status_code == 503
    assert "NIGHTSHIFT_EVENT_WEBHOOK_SECRET" in response.json()["error"]


def test_an_event_starts_one_run_however_often_it_arrives(api: TestClient) -> None:
    delivery = {"event_id": "req-42", "payload": REPORT_REQUEST}
    path = "/events/ops-report-request"
    first = api.post(path, **signed(path, delivery))
    again = api.post(path, **signed(path, delivery, now=time.time() + 1))
    assert first.status_code == 201, first.text
    assert first.json()["duplicate"] is False
    assert again.status_code == 200
    assert again.json() == {"run_id": first.json()["run_id"], "duplicate": True, "deliveries": 2}
    assert count(Run) == 1 and count(ExternalEvent) == 1


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/events/nope", {"event_id": "e1", "payload": {}}, 404, "unknown event source 'nope'"),
        ("/events/ops-report-request", {"event_id": "e1", "payload": {"team": "ops"}}, 422,
         "cannot become a nightly_report run"),
        ("/events/ops-report-request", {"event_id": "", "payload": {}}, 422, "'event_id'"),
        ("/events/ops-report-request", {"event_id": "e1", "payload": [1]}, 422, "'payload'"),
    ],
)  # fmt: skip
def test_a_bad_event_is_refused_and_starts_nothing(
    api: TestClient, path: str, body: dict, status: int, words: str
) -> None:
    response = api.post(path, **signed(path, body))
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert count(Run) == 0 and count(ExternalEvent) == 0
    unsigned = api.post(path, json=body)
    assert unsigned.status_code == 401


def test_an_event_signed_for_one_source_is_refused_for_another(api: TestClient) -> None:
    delivery = {"event_id": "req-9", "payload": REPORT_REQUEST}
    elsewhere = signed("/events/some-other-source", delivery)
    response = api.post("/events/ops-report-request", **elsewhere)
    assert response.status_code == 401 and "does not match" in response.json()["error"]
    # nor does the approval secret sign events
    wrong_secret = signed("/events/ops-report-request", delivery, secret=APPROVAL_SECRET)
    assert api.post("/events/ops-report-request", **wrong_secret).status_code == 401
    assert count(Run) == 0 and count(ExternalEvent) == 0


def documented_examples() -> list[tuple[str, str]]:
    """docs/api.md's copy-paste signing examples: (language, code)."""
    doc = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    section = doc.split("## Signed webhooks", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(python|sh)\n(.*?)```", section, flags=re.S)


def test_the_documented_examples_sign_events_the_server_accepts(db_url: str) -> None:
    examples = documented_examples()
    assert [language for language, _ in examples] == ["python", "sh"]
    env = {**os.environ, "NIGHTSHIFT_EVENT_WEBHOOK_SECRET": EVENT_SECRET}
    with live_server(make_app()) as base:
        for language, code in examples:
            code = code.replace("http://localhost:8000", base).replace("localhost:8000", base)
            argv = [sys.executable, "-c", code] if language == "python" else ["sh", "-c", code]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, done.stderr
            assert '"duplicate"' in done.stdout or "'duplicate'" in done.stdout, done.stdout
    assert count(Run) == 2 and count(ExternalEvent) == 2
