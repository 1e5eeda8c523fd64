"""Signed webhooks: approvals decided once, events started once, and every unsigned, stale or
tampered request refused with 401 before anything is read or written."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest
from fastapi.testclient import TestClient

from models import ActionState, Event, Run, RunStatus
from pipeline.api.webhooks import BadSignature, signature, verify
from tests.integration.api_fixtures import (
    PR_KEY,
    SECRET,
    action_row,
    client,
    count,
    park_on_approval,
    signed,
)
from tests.support import run_row

APPROVE = {"decision": "approve", "by": "alice@example.com", "note": "looks right"}
REPORT_REQUEST = {"team": "ops", "date": "2026-11-29"}


@pytest.fixture
def api(db_url: str) -> TestClient:
    return client()


def approval(api: TestClient, body: dict | bytes, key: str = PR_KEY, **sign: object):
    return api.post(f"/approvals/{key}", **signed(body, **sign))  # type: ignore[arg-type]


def test_the_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    body = b'{"decision": "approve"}'
    expected = hmac.new(SECRET.encode(), b"1764400000." + body, hashlib.sha256).hexdigest()
    assert signature(SECRET, "1764400000", body) == f"sha256={expected}"
    verify(SECRET, "1764400000", f"sha256={expected}", body, now=1764400000 + 299)
    with pytest.raises(BadSignature, match="in the past"):
        verify(SECRET, "1764400000", f"sha256={expected}", body, now=1764400000 + 301)


def test_an_approval_is_decided_once_and_wakes_the_run(api: TestClient) -> None:
    # given a patch run waiting for a person to approve its pull request
    run_id = park_on_approval()

    # when the approval webhook fires, then fires again (a retry, or a replay in the window)
    first = approval(api, APPROVE)
    again = approval(api, APPROVE)

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
    late = approval(api, {"decision": "reject", "by": "bob@example.com"})
    assert late.status_code == 409
    assert "already decided (approve by alice@example.com)" in late.json()["error"]
    assert action_row().state == ActionState.INTENDED


def test_unknown_actions_and_strangers_are_refused(api: TestClient) -> None:
    park_on_approval(approvers=("alice@example.com",))
    unknown = approval(api, APPROVE, key="pr:acme/shop:patch/issue-999")
    assert unknown.status_code == 404
    assert "'pr:acme/shop:patch/issue-999'" in unknown.json()["error"]
    stranger = approval(api, {"decision": "approve", "by": "mallory@example.com"})
    assert stranger.status_code == 403
    assert "mallory@example.com" in stranger.json()["error"]
    assert action_row().state == ActionState.PENDING_APPROVAL
    assert approval(api, APPROVE).json()["first"] is True


def _tampered(api: TestClient) -> object:
    request = signed(APPROVE)
    request["content"] = json.dumps({**APPROVE, "by": "mallory@example.com"}).encode()
    return api.post(f"/approvals/{PR_KEY}", **request)


def _unsigned(api: TestClient) -> object:
    return api.post(f"/approvals/{PR_KEY}", json=APPROVE)


def _with(**headers: str):
    def send(api: TestClient) -> object:
        request = signed(APPROVE)
        request["headers"] = {**request["headers"], **headers}
        return api.post(f"/approvals/{PR_KEY}", **request)

    return send


REFUSED = {
    "unsigned": (_unsigned, "missing"),
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
    assert SECRET not in response.text  # type: ignore[attr-defined]
    assert action_row().state == ActionState.PENDING_APPROVAL


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b'{"decision": "approve", ', 400, "not valid JSON"),
        ({"decision": "maybe", "by": "alice@example.com"}, 422, "'decision'"),
        ({"decision": "approve"}, 422, "'by'"),
        ({"decision": "approve", "by": ""}, 422, "'by'"),
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


def test_webhooks_are_off_without_a_secret(db_url: str) -> None:
    api = client(webhook_secret=None)
    response = approval(api, APPROVE)
    assert response.status_code == 503
    assert "NIGHTSHIFT_WEBHOOK_SECRET" in response.json()["error"]


def test_an_event_starts_one_run_however_often_it_arrives(api: TestClient) -> None:
    delivery = {"event_id": "req-42", "payload": REPORT_REQUEST}
    first = api.post("/events/ops-report-request", **signed(delivery))
    again = api.post("/events/ops-report-request", **signed(delivery))
    assert first.status_code == 201, first.text
    assert first.json()["duplicate"] is False
    assert again.status_code == 200
    assert again.json() == {"run_id": first.json()["run_id"], "duplicate": True, "deliveries": 2}
    assert count(Run) == 1 and count(Event) == 1


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
    response = api.post(path, **signed(body))
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert count(Run) == 0 and count(Event) == 0
    unsigned = api.post(path, json=body)
    assert unsigned.status_code == 401
