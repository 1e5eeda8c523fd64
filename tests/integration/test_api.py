"""The JSON API: starting runs once per key, reading runs and batches, cancelling, health,
and the right 4xx (with a clear {"error"} and nothing written) for every bad request."""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import socket
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from models import Action, ActionState, ApiToken, Batch, Run, RunStatus
from pipeline.api.base import ApiConfig
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.errors import SettingsError
from pipeline.registry import registry
from pipeline.runs.start import create_run_txn
from pipeline.settings import get_settings
from tests.integration.api_fixtures import (
    AUTH,
    PR_KEY,
    TOKEN,
    action_row,
    audit_trail,
    bearer,
    client,
    count,
    live_server,
    make_app,
    park_on_approval,
    person_token,
)
from tests.support import run_row

REPORT = {"agent": "nightly_report", "input": {"team": "ops", "date": "2026-11-29"}}


@pytest.fixture
def api(db_url: str) -> TestClient:
    return client()


def test_the_same_idempotency_key_starts_one_run(api: TestClient) -> None:
    # given a caller that retries its request with the same key
    headers = {**AUTH, "Idempotency-Key": "ops-report-2026-11-29"}
    first = api.post("/runs", json=REPORT, headers=headers)
    again = api.post("/runs", json=REPORT, headers=headers)

    # then the first created the run and the retry got the same id back
    assert first.status_code == 201, first.text
    assert first.json()["created"] is True
    assert first.headers["location"] == f"/runs/{first.json()['run_id']}"
    assert again.status_code == 200
    assert again.json() == {"run_id": first.json()["run_id"], "created": False}

    # and the same key with a different request is refused, naming the run it started
    other = {**REPORT, "input": {"team": "ops", "date": "2026-11-30"}}
    conflict = api.post("/runs", json=other, headers=headers)
    assert conflict.status_code == 409
    assert first.json()["run_id"] in conflict.json()["error"]
    assert count(Run) == 1


def test_runs_are_listed_filtered_and_shown(api: TestClient) -> None:
    # given two runs of different agents, one of them finished
    report = api.post("/runs", json=REPORT, headers=AUTH).json()["run_id"]
    bug = {"issue": 1, "repo": "acme/shop", "title": "broken"}
    patch = api.post("/runs", json={"agent": "patch", "input": bug}, headers=AUTH).json()
    with transaction() as session:
        session.execute(
            update(Run).where(Run.id == uuid.UUID(report)).values(status=RunStatus.SUCCEEDED)
        )

    # then filters by status and agent pick one each, and limit caps the list
    def ids(query: str) -> list[str]:
        response = api.get(f"/runs{query}", headers=AUTH)
        assert response.status_code == 200, response.text
        return [run["id"] for run in response.json()["runs"]]

    assert set(ids("")) == {report, patch["run_id"]}
    assert ids("?status=succeeded") == [report]
    assert ids("?agent=patch") == [patch["run_id"]]
    assert len(ids("?limit=1")) == 1

    # and one run shows with its input and timeline
    shown = api.get(f"/runs/{report}", headers=AUTH).json()
    assert shown["run"]["input"] == REPORT["input"]
    assert shown["run"]["status"] == "succeeded"
    assert shown["journal"] == [] and shown["actions"] == []


def test_a_waiting_run_is_cancelled_at_once(api: TestClient) -> None:
    run_id = api.post("/runs", json=REPORT, headers=AUTH).json()["run_id"]
    with transaction() as session:
        session.execute(
            update(Run).where(Run.id == uuid.UUID(run_id)).values(status=RunStatus.WAITING)
        )
    # a body naming someone is refused: the run records whom the token speaks for
    oncall = bearer(person_token("oncall@example.com"))
    claimed = api.post(f"/runs/{run_id}/cancel", json={"by": "the-ceo"}, headers=oncall)
    assert claimed.status_code == 422 and "'by'" in claimed.json()["error"]
    assert run_row(uuid.UUID(run_id)).status == RunStatus.WAITING
    response = api.post(f"/runs/{run_id}/cancel", json={}, headers=oncall)
    assert response.status_code == 200, response.text
    assert response.json() == {"run_id": run_id, "status": "cancelled"}
    assert run_row(uuid.UUID(run_id)).cancel_requested_by == "oncall@example.com"
    # a body is optional, and cancelling a finished run changes nothing
    again = api.post(f"/runs/{run_id}/cancel", headers=AUTH)
    assert again.json()["status"] == "cancelled"


def test_a_batch_shows_the_progress_of_its_runs(api: TestClient) -> None:
    # given a batch with four child runs in three statuses
    batch_id = "competitor-monitor:2026-11-29T07:00:00+00:00"
    with transaction() as session:
        session.add(Batch(id=batch_id, name="competitor_monitor", params={}))
        session.flush()
        for status in ("succeeded", "succeeded", "failed", "running"):
            run_id = create_run_txn(session, "nightly_report", REPORT["input"], batch_id=None)
            session.execute(
                update(Run)
                .where(Run.id == run_id.run_id)
                .values(batch_id=batch_id, status=RunStatus(status))
            )

    # then the batch comes with its children counted by status
    response = api.get(f"/batches/{batch_id}", headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["id"], body["name"], body["status"]) == (
        batch_id,
        "competitor_monitor",
        "running",
    )
    assert body["children"] == {
        "done": 2,
        "running": 1,
        "waiting": 0,
        "failed": 1,
        "tokens": 0,
        "total": 4,
        "finished": 3,
    }
    assert body["synthesis"]["run_id"] is None and body["pending_approvals"] == []


BAD_REQUESTS = [
    # (what, request kwargs, status, words the error must contain)
    ("bad JSON", {"content": b'{"agent": ', "headers": {"Content-Type": "application/json"}},
     400, "not valid JSON"),
    ("no input", {"json": {"agent": "nightly_report"}}, 422, "'input'"),
    ("input not an object", {"json": {"agent": "nightly_report", "input": [1]}}, 422, "'input'"),
    ("an unknown field", {"json": {**REPORT, "priority": 1}}, 422, "'priority'"),
    ("an unknown agent", {"json": {"agent": "nope", "input": {}}}, 422, "unknown agent 'nope'"),
    ("input the agent refuses", {"json": {"agent": "nightly_report", "input": {"team": "ops"}}},
     422, "'date' is a required property"),
    ("input over the agent limit",
     {"json": {"agent": "nightly_report", "input": {"team": "ops", "x": "y" * 70_000}}},
     413, "NIGHTSHIFT_MAX_INPUT_BYTES"),
    ("a body over the API limit", {"content": b"{" + b" " * (1024 * 1024) + b"}",
     "headers": {"Content-Type": "application/json"}}, 413, "NIGHTSHIFT_API_MAX_BODY_BYTES"),
    ("a key that is too long", {"json": REPORT, "headers": {"Idempotency-Key": "k" * 201}},
     422, "idempotency-key"),
    ("an empty key", {"json": REPORT, "headers": {"Idempotency-Key": ""}}, 422, "idempotency-key"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "kwargs", "status", "words"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS]
)
def test_a_bad_start_request_gets_a_clear_error_and_writes_nothing(
    api: TestClient, what: str, kwargs: dict, status: int, words: str
) -> None:
    headers = {**AUTH, **kwargs.pop("headers", {})}
    response = api.post("/runs", headers=headers, **kwargs)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert count(Run) == 0


def test_unknown_ids_are_404s_that_name_the_id(api: TestClient) -> None:
    missing = uuid.uuid4()
    for path in (f"/runs/{missing}", f"/runs/{missing}/cancel"):
        method = api.post if path.endswith("cancel") else api.get
        response = method(path, headers=AUTH)
        assert response.status_code == 404
        assert str(missing) in response.json()["error"]
    response = api.get("/runs/not-a-uuid", headers=AUTH)
    assert response.status_code == 404 and "'not-a-uuid'" in response.json()["error"]
    response = api.get("/batches/nightly:nope", headers=AUTH)
    assert response.status_code == 404 and "'nightly:nope'" in response.json()["error"]
    response = api.get("/runs?status=sleeping", headers=AUTH)
    assert response.status_code == 422 and "'status'" in response.json()["error"]


def test_every_route_but_health_needs_the_token(
    api: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = {"Authorization": "Bearer wrong-token-but-long-enough-1234"}
    run_id = uuid.uuid4()
    for method, path in (("POST", "/runs"), ("GET", "/runs"), ("GET", f"/runs/{run_id}"),
                         ("POST", f"/runs/{run_id}/cancel"), ("GET", "/batches/b"),
                         ("GET", "/metrics")):  # fmt: skip
        for headers in ({}, wrong, {"Authorization": TOKEN}):
            response = api.request(method, path, json=REPORT, headers=headers)
            assert response.status_code == 401, (method, path, headers)
            assert response.headers["www-authenticate"] == "Bearer"
            assert "token" in response.json()["error"]
    assert count(Run) == 0
    assert api.get("/healthz").status_code == 200
    # the tokens, right or wrong, appear in no response and no log line
    assert all(TOKEN not in r.getMessage() for r in caplog.records)
    assert all("wrong-token" not in r.getMessage() for r in caplog.records)


def test_a_metrics_token_opens_metrics_and_nothing_else(db_url: str) -> None:
    scrape = "prometheus-read-only-token-0123"
    api = client(metrics_token=scrape)
    headers = {"Authorization": f"Bearer {scrape}"}
    response = api.get("/metrics", headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert api.get("/metrics", headers=AUTH).status_code == 200
    assert api.get("/runs", headers=headers).status_code == 401


def test_the_api_refuses_to_start_without_a_token(
    db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given no NIGHTSHIFT_API_TOKEN
    monkeypatch.delenv("NIGHTSHIFT_API_TOKEN", raising=False)
    get_settings.cache_clear()
    with pytest.raises(SettingsError, match="--insecure-no-auth"):
        ApiConfig.from_env({})
    # and the command says so and exits 2
    assert main(["api", "--port", "0"]) == 2
    assert "nightshift: NIGHTSHIFT_API_TOKEN is not set" in capsys.readouterr().err
    # a short token is refused too; asked explicitly, it serves without auth
    with pytest.raises(SettingsError, match="at least 16 characters"):
        ApiConfig.from_env({"NIGHTSHIFT_API_TOKEN": "short"})
    open_api = client(api_token=None, insecure_no_auth=True)
    assert open_api.get("/runs").status_code == 200


def test_approvals_and_events_need_two_different_webhook_secrets() -> None:
    token = {"NIGHTSHIFT_API_TOKEN": TOKEN}
    same = "one-secret-for-both-0123"
    with pytest.raises(SettingsError, match="must differ"):
        ApiConfig.from_env(
            {
                **token,
                "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET": same,
                "NIGHTSHIFT_EVENT_WEBHOOK_SECRET": same,
            }
        )
    config = ApiConfig.from_env(
        {
            **token,
            "NIGHTSHIFT_APPROVAL_WEBHOOK_SECRET": "approvals-secret-0123",
            "NIGHTSHIFT_EVENT_WEBHOOK_SECRET": "events-secret-0123456",
        }
    )
    assert "approvals-secret" not in repr(config) and "events-secret" not in repr(config)


def test_health_checks_the_database_and_the_broker(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert api.get("/healthz").json() == {"database": "ok", "broker": "ok"}
    # when the broker is unreachable (its URL carries a password that must not leak)
    monkeypatch.setenv("NIGHTSHIFT_BROKER_URL", "redis://:hunter2-secret@127.0.0.1:1/0")
    get_settings.cache_clear()
    response = api.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["database"] == "ok" and body["broker"].startswith("unavailable")
    assert "hunter2" not in response.text


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port whose accept queue is full: a new connection's SYN is dropped, so connecting
    hangs (as behind a partition) instead of being refused."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.2)
    yield port
    for sock in (*fillers, server):
        sock.close()


def test_health_answers_in_seconds_when_the_database_does_not_answer(
    api: TestClient, monkeypatch: pytest.MonkeyPatch, black_hole: int
) -> None:
    # when connecting to the database hangs
    monkeypatch.setenv("NIGHTSHIFT_DATABASE_URL", f"postgresql://u:pw@127.0.0.1:{black_hole}/x")
    get_settings.cache_clear()
    started = time.monotonic()
    response = api.get("/healthz")

    # then /healthz says so within its connect timeout, not after TCP gives up (minutes)
    assert response.status_code == 503
    assert response.json()["database"].startswith("unavailable")
    assert time.monotonic() - started < 10


def test_the_openapi_document_describes_the_api(api: TestClient) -> None:
    document = api.get("/openapi.json", headers=AUTH).json()
    assert {"/runs", "/runs/{run_id}", "/runs/{run_id}/cancel", "/batches/{batch_id}",
            "/approvals/{action_key}", "/events/{source}", "/metrics", "/healthz"} <= set(
        document["paths"]
    )  # fmt: skip
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    approval = document["paths"]["/approvals/{action_key}"]["post"]
    assert {p["name"] for p in approval["parameters"]} >= {
        "X-Nightshift-Timestamp",
        "X-Nightshift-Signature",
    }
    assert (
        "decision" in approval["requestBody"]["content"]["application/json"]["schema"]["properties"]
    )
    # every error a route answers is documented, with the error body
    start = document["paths"]["/runs"]["post"]["responses"]
    assert {"200", "201", "400", "401", "409", "413", "422"} <= set(start)
    error = {"$ref": "#/components/schemas/ErrorBody"}
    assert start["401"]["content"]["application/json"]["schema"] == error
    assert {"401", "404", "409", "422"} <= set(
        document["paths"]["/runs/{run_id}"]["get"]["responses"]
    )
    assert "503" in document["paths"]["/healthz"]["get"]["responses"]
    assert {"401", "403", "404", "409", "503"} <= set(approval["responses"])
    assert "HTTPValidationError" not in document["components"]["schemas"]
    # and a run's body is one per registered agent, its input that agent's own input schema
    schemas = document["components"]["schemas"]
    forms = schemas["StartRun"]["discriminator"]["mapping"]
    assert {"nightly_report", "patch", "price_synthesis"} <= set(forms)
    report = schemas["StartRun.nightly_report"]["properties"]
    assert report["agent"] == {"const": "nightly_report"}
    declared = registry().agent("nightly_report").input_schema
    assert report["input"]["required"] == declared["required"]
    assert report["input"]["properties"].keys() == declared["properties"].keys()
    # with the deadline's forms, and no notify_url where the server cannot sign its events
    forms_of_deadline = {f.get("format") or f["type"] for f in report["deadline"]["anyOf"]}
    assert forms_of_deadline == {"number", "string", "null"}  # an ISO time: the description
    assert "ISO-8601" in report["deadline"]["description"]
    assert report["notify_url"]["type"] == "null"
    # and an event stream's resume point has the form of an event id, no null
    events = document["paths"]["/runs/{run_id}/events"]["get"]["parameters"]
    resume = {p["name"]: p["schema"] for p in events if p["name"] != "run_id"}
    assert {s["pattern"] for s in resume.values()} == {r"^(?:[0-9]{1,39}|[0-9]{1,20}-[0-9]{1,19})$"}


def test_the_docs_are_behind_sign_in_and_load_nothing_from_elsewhere(api: TestClient) -> None:
    # without a credential: the document is refused and the page sends people to sign in
    assert api.get("/openapi.json").status_code == 401
    assert api.get("/docs", follow_redirects=False).headers["location"] == "/ui/login"
    # with one, Swagger UI comes from this server
    page = api.get("/docs", headers=AUTH)
    assert page.status_code == 200 and "/docs/static/swagger-ui-bundle.js" in page.text
    assert "cdn" not in page.text.lower() and "https://" not in page.text
    assert api.get("/docs/static/swagger-ui-bundle.js").status_code == 200
    # and a method a path does not take is a 405 that names every method it does
    refused = api.patch("/runs", headers=AUTH)
    assert (refused.status_code, refused.headers["allow"]) == (405, "GET, POST")


def test_a_chunked_body_over_the_limit_is_refused_by_its_size(db_url: str) -> None:
    # given a client that streams its body without a Content-Length
    def chunks():
        for _ in range(20):
            yield b" " * 100_000

    with live_server(make_app()) as base:
        response = httpx.post(
            f"{base}/runs", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}
        )
    assert response.status_code == 413
    assert "limit is 1048576" in response.json()["error"]
    assert count(Run) == 0


def test_people_decide_and_cancel_from_the_command_line(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a pull request waiting for approval
    run_id = park_on_approval()
    assert main(["actions", "list", "--state", "pending_approval", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["idempotency_key"] == PR_KEY

    # when a person approves it twice and someone else rejects it
    assert main(["approve", PR_KEY, "--as", "alice@example.com", "--note", "ok"]) == 0
    assert "recorded; state intended" in capsys.readouterr().out
    assert main(["approve", PR_KEY, "--as", "alice@example.com"]) == 0
    assert "already recorded; nothing changed" in capsys.readouterr().out
    assert main(["reject", PR_KEY, "--as", "bob@example.com"]) == 2
    assert "nightshift: action 'patch:acme/shop:patch/issue-7' was already decided" in (
        capsys.readouterr().err
    )
    assert action_row().decided_by == "alice@example.com"
    # the audit trail says the CLI recorded a name given with --as, and whose OS account it was
    [approved] = audit_trail(PR_KEY)
    assert approved.by == "alice@example.com"
    assert approved.via == f"cli --as (OS user {getpass.getuser()})"

    # and an action whose outcome is unknown is resolved by a person who checked
    with transaction() as session:
        session.execute(
            update(Action)
            .where(Action.idempotency_key == PR_KEY)
            .values(state=ActionState.OUTCOME_UNKNOWN)
        )
    assert main(["actions", "resolve", PR_KEY, "--happened"]) == 0
    assert action_row().state == ActionState.CONFIRMED
    resolved = audit_trail(PR_KEY)[-1]
    assert (resolved.event, resolved.by, resolved.via) == (
        "happened",
        getpass.getuser(),
        "cli (OS user)",
    )
    assert main(["actions", "resolve", "no-such-key", "--did-not-happen"]) == 2
    assert "no action has idempotency key 'no-such-key'" in capsys.readouterr().err

    # and the run is cancelled by hand (it runs, so it stops at its next step)
    assert main(["cancel", str(run_id), "--by", "carol"]) == 0
    assert "cancel requested" in capsys.readouterr().out
    assert main(["cancel", "nope"]) == 2


def test_run_routes_take_a_unique_id_prefix(db_url: str) -> None:
    api = client()
    full = api.post("/runs", json=REPORT, headers=AUTH).json()["run_id"]
    shown = api.get(f"/runs/{full[:8]}", headers=AUTH)
    assert shown.status_code == 200 and shown.json()["run"]["id"] == full
    unknown = api.get("/runs/0123abcd", headers=AUTH)
    assert unknown.status_code == 404 and "no run id starts with" in unknown.json()["error"]
    cancelled = api.post(f"/runs/{full[:8]}/cancel", headers=AUTH)
    assert cancelled.status_code == 200 and cancelled.json()["run_id"] == full


def test_tokens_are_made_for_a_person_shown_once_stored_hashed_and_revoked(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # when an operator makes a token for the pricing manager
    assert main(["tokens", "create", "--for", "pricing@acme.example", "--json"]) == 0
    issued = json.loads(capsys.readouterr().out)
    token = issued["token"]
    assert token.startswith("nst_") and len(token) > 40

    # then only its hash is stored, and it speaks for that person
    with transaction() as session:
        row = session.execute(select(ApiToken)).scalar_one()
    assert row.identity == "pricing@acme.example" and token not in repr(row.__dict__)
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    api = client()
    assert api.get("/runs", headers=bearer(token)).status_code == 200

    # and the list names it by prefix, never in full
    assert main(["tokens", "list"]) == 0
    listing = capsys.readouterr().out
    assert token[:12] in listing and token not in listing and "pricing@acme.example" in listing

    # and once revoked it opens nothing
    assert main(["tokens", "revoke", token[:12]]) == 0
    assert "revoked" in capsys.readouterr().out
    assert api.get("/runs", headers=bearer(token)).status_code == 401
    assert main(["tokens", "list"]) == 0
    assert token[:12] not in capsys.readouterr().out
    assert main(["tokens", "revoke", "nst_nosuchone"]) == 2
    assert "no token has id or prefix 'nst_nosuchone'" in capsys.readouterr().err
    assert main(["tokens", "create", "--for", "NIGHTSHIFT_API_TOKEN"]) == 2
    assert "reserved" in capsys.readouterr().err
