"""Completion webhooks: a run's (or batch's) notify_url hears, once per transition, when it
finishes or starts waiting for a person, in a signed POST sent through the action protocol."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from models import ActionState, Run, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.delivery.sender import Delivery, deliver
from pipeline.errors import InvalidInput
from pipeline.runs import fanout
from pipeline.runs.decisions import Actor, Decision, decide
from pipeline.runs.schedules import check_schedule
from pipeline.runs.start import start_run
from pipeline.runs.tick import tick
from pipeline.sandbox.githost import GitHostSandbox
from pipeline.sandbox.hooks import HookSandbox
from pipeline.settings import get_settings
from pipeline.slots import Schedule
from tests.integration.api_fixtures import AUTH, client
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.support import Webhook, wait_for, wait_for_status, webhooks

SECRET = "test-notify-secret-not-secret-0123"
REPORT = {"team": "ops", "date": "2026-11-29"}


@pytest.fixture
def hooks(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HookSandbox]:
    """A receiver that honours Idempotency-Key and checks signatures with the shared secret."""
    receiver = HookSandbox(secret=SECRET, log_path=tmp_path / "hooks.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_NOTIFY_SECRET", SECRET)
    monkeypatch.setenv("NIGHTSHIFT_NOTIFY_ALLOWED", "127.0.0.1")  # the receiver is local
    get_settings.cache_clear()
    yield receiver
    receiver.stop()


def set_status(run_id: uuid.UUID, status: RunStatus, **values: Any) -> None:
    with transaction() as session:
        session.execute(update(Run).where(Run.id == run_id).values(status=status, **values))


def deliver_due() -> list[Delivery]:
    """What a worker would do with the tasks the tick sends: each due webhook, once."""
    return [deliver(n.key) for n in webhooks() if not n.state.is_terminal()]


def test_a_run_is_notified_once_when_the_worker_dies_right_after_the_post(
    sandbox: Sandbox,
    hooks: HookSandbox,
    processes: ProcessFactory,
    duplicate_report: list[int],
) -> None:
    # given beat, and a worker that dies right after a webhook POST, before saving the reply
    processes("beat", beat=True)
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_notify_sent"})
    run_id = start_run("nightly_report", REPORT, notify_url=f"{hooks.url}/hooks/ops").run_id
    key = f"run:{run_id}:finished"

    # when the run finishes, its event is posted, and the worker dies before recording it
    wait_for(doomed.exited, timeout=60, what="the worker to die after the POST")
    assert len(hooks.deliveries(key)) == 1
    assert [n.state for n in webhooks()] == [ActionState.ATTEMPTED]

    # then a healthy worker finds the outcome unknown and sends it again with the same key
    processes("healthy")

    def confirmed() -> Webhook | None:
        found = webhooks()
        return found[0] if found and found[0].state is ActionState.CONFIRMED else None

    sent = wait_for(confirmed, timeout=60, what="the notification to be confirmed")
    # and the receiver, honouring the key, took it once: one delivery, one replay
    duplicate_report.append(len(hooks.deliveries(key)) - 1)
    assert len(hooks.deliveries(key)) == 1
    assert [r["action"] for r in hooks.requests(key)] == ["delivered", "replayed"]
    assert (sent.attempts, sent.key, sent.response_status) == (2, key, 200)
    [delivery] = hooks.deliveries(key)
    assert delivery["signature_ok"] is True and delivery["event"] == "run.finished"
    body = delivery["body"]
    assert (body["event"], body["id"], body["run"]["id"]) == ("run.finished", key, str(run_id))
    assert body["run"]["status"] == "succeeded" and "report" in body["run"]["result"]["text"]
    assert wait_for_status(run_id, {RunStatus.SUCCEEDED.value}).status is RunStatus.SUCCEEDED


def test_waiting_for_approval_and_finishing_are_each_told_once(
    hooks: HookSandbox,
    githost: GitHostSandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
) -> None:
    # given a run, started through the API, that asks to open a pull request
    register_agents("tests.fixture_agents:APPROVAL_ONLY")
    processes("w1")
    processes("beat", beat=True)
    body = {"agent": "approval_only", "input": {"issue": 71, "repo": "acme/shop"},
            "notify_url": f"{hooks.url}/hooks/reviews"}  # fmt: skip
    started = client().post("/runs", json=body, headers=AUTH)
    assert started.status_code == 201, started.text
    run_id = uuid.UUID(started.json()["run_id"])

    # when it waits for the approval: the receiver hears of the wait
    wait_for_status(run_id, {RunStatus.WAITING.value}, timeout=30)
    wait_for(lambda: hooks.deliveries(), timeout=30, what="the wait to be told")
    [waiting] = hooks.deliveries()
    assert waiting["event"] == "run.waiting" and waiting["key"].startswith(f"run:{run_id}:waiting:")
    assert waiting["body"]["run"]["waiting_on"] == "approval:approval_only:acme/shop:patch/issue-71"

    # and when a person approves and the run finishes: of the finish, once
    lead = Actor("lead@example.com", "test")
    decide("approval_only:acme/shop:patch/issue-71", Decision.APPROVE, lead)
    wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=30)
    wait_for(lambda: len(hooks.deliveries()) == 2, timeout=30, what="the finish to be told")
    time.sleep(2)  # a tick or two later, nothing more arrives
    events = [(d["event"], d["key"]) for d in hooks.deliveries()]
    assert events == [("run.waiting", waiting["key"]), ("run.finished", f"run:{run_id}:finished")]
    assert all(d["signature_ok"] for d in hooks.deliveries())
    assert {n.state for n in webhooks()} == {ActionState.CONFIRMED}


def test_a_receiver_that_is_down_is_sent_the_event_again_later_and_gets_it_once(
    hooks: HookSandbox,
) -> None:
    # given a run with a notify_url that waits on a timer (no one to tell) and then finishes
    run_id = start_run("nightly_report", REPORT, notify_url=f"{hooks.url}/hooks/ops").run_id
    set_status(run_id, RunStatus.WAITING, waiting_on="timer:toolu_1")
    set_status(run_id, RunStatus.RUNNING, waiting_on=None)
    set_status(run_id, RunStatus.FAILED, stop_reason="deadline", error="too late")
    [owed] = webhooks()
    assert (owed.event, owed.key) == ("run.finished", f"run:{run_id}:finished")

    # when the receiver answers 503 twice
    httpx.post(f"{hooks.url}/_control/fail", json={"times": 2, "status": 503}).raise_for_status()
    assert deliver(owed.key) is Delivery.RETRY
    assert deliver(owed.key) is Delivery.SKIPPED  # not due yet: backoff
    later = webhooks()[0]
    assert later.state is ActionState.OUTCOME_UNKNOWN and later.next_attempt_at > later.updated_at

    # then it is tried again when due, and again, until it is received, once
    outcomes = []
    deadline = time.monotonic() + 30
    while webhooks()[0].state is not ActionState.CONFIRMED and time.monotonic() < deadline:
        outcomes += [o for o in deliver_due() if o is not Delivery.SKIPPED]
        time.sleep(0.2)
    assert outcomes == [Delivery.RETRY, Delivery.DELIVERED]
    done = webhooks()[0]
    assert (done.state, done.attempts, done.response_status) == (ActionState.CONFIRMED, 3, 200)
    assert [r["action"] for r in hooks.requests()] == ["refused", "refused", "delivered"]
    body = hooks.deliveries()[0]["body"]
    assert (body["run"]["status"], body["run"]["error"]) == ("failed", "too late")


def test_a_receiver_that_fails_is_probed_by_one_notification_and_the_rest_follow_its_answer(
    hooks: HookSandbox,
) -> None:
    # given three runs that finished, each owing the same receiver a notification
    url = f"{hooks.url}/hooks/ops"
    for day in (1, 2, 3):
        run_id = start_run("nightly_report", {**REPORT, "date": f"2026-11-0{day}"}, notify_url=url)
        set_status(run_id.run_id, RunStatus.SUCCEEDED)
    first, *others = webhooks()

    # when the first is answered 503: the others are put off in their rows, past its retry
    httpx.post(f"{hooks.url}/_control/fail", json={"times": 1, "status": 503}).raise_for_status()
    assert deliver(first.key) is Delivery.RETRY
    probe = webhooks()[0]
    for put_off in webhooks()[1:]:
        assert put_off.next_attempt_at > probe.next_attempt_at and put_off.attempts == 0
        assert "its receiver failed just before (HTTP 503" in (put_off.error or "")
    assert [deliver(n.key) for n in others] == [Delivery.SKIPPED] * 2  # not due: nothing sent
    assert tick().notified == []

    # then the probe is tried when its retry is due, and once it is received the others are
    # due at once (not at the end of their put-off)
    wait_for(lambda: tick().notified == [first.key], timeout=30, what="the probe to be due")
    assert deliver(first.key) is Delivery.DELIVERED
    assert [deliver(n.key) for n in others] == [Delivery.DELIVERED] * 2
    assert [r["action"] for r in hooks.requests()] == ["refused", *["delivered"] * 3]


def test_a_receiver_that_refuses_fails_the_notification_without_more_attempts(
    hooks: HookSandbox,
) -> None:
    run_id = start_run("nightly_report", REPORT, notify_url=f"{hooks.url}/hooks/ops").run_id
    set_status(run_id, RunStatus.CANCELLED, stop_reason="cancelled")
    httpx.post(f"{hooks.url}/_control/fail", json={"times": 5, "status": 410}).raise_for_status()
    [owed] = webhooks()
    assert deliver(owed.key) is Delivery.FAILED
    failed = webhooks()[0]
    assert (failed.state, failed.attempts, failed.response_status) == (ActionState.FAILED, 1, 410)
    assert "HTTP 410" in (failed.error or "")
    assert tick().notified == []  # nothing owed any more


def test_a_batch_is_told_when_one_of_its_runs_waits_for_a_person_and_when_it_ends(
    hooks: HookSandbox, register_agents: Callable[..., None]
) -> None:
    # given a nightly batch whose schedule names a notify_url
    register_agents("tests.fixture_agents:TEST_BATCH")
    schedule = Schedule(name="batchy", agent="test_batch", hour="2",
                        notify_url=f"{hooks.url}/hooks/night")  # fmt: skip
    [night] = check_schedule(schedule, now=datetime(2026, 11, 29, 2, 0, 10, tzinfo=UTC))
    assert night.batch_id is not None
    with transaction() as session:
        children = session.scalars(select(Run.id).where(Run.batch_id == night.batch_id)).all()
        for child in children:
            session.execute(update(Run).where(Run.id == child).values(status=RunStatus.SUCCEEDED))
        synthesis = fanout.child_finished_txn(session, night.batch_id)
    assert synthesis is not None
    # when the synthesis waits for a price change to be approved, and then the batch ends
    set_status(synthesis, RunStatus.WAITING, waiting_on="approval:price:sku-2:night")
    with transaction() as session:
        session.execute(update(Run).where(Run.id == synthesis).values(status=RunStatus.SUCCEEDED))
        fanout.synthesis_finished_txn(session, synthesis, RunStatus.SUCCEEDED)
    assert len(tick().notified) == 2
    assert deliver_due() == [Delivery.DELIVERED, Delivery.DELIVERED]
    # then the batch's receiver heard of both, each once; the runs have no notify_url
    told = {d["event"]: d["body"] for d in hooks.deliveries()}
    assert set(told) == {"batch.waiting", "batch.finished"}
    assert told["batch.waiting"]["run"]["waiting_on"] == "approval:price:sku-2:night"
    assert told["batch.finished"]["batch"] == {
        "id": night.batch_id, "name": "test_batch", "status": "succeeded", "stop_reason": None,
    }  # fmt: skip
    assert all(d["signature_ok"] for d in hooks.deliveries())
    assert deliver_due() == [] and len(hooks.deliveries()) == 2


def test_a_notify_url_is_checked_where_it_is_given(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    api = client()
    for bad, why in (("ftp://example.com/x", "http:// or https://"), ("https://", "with a host")):
        refused = api.post("/runs", json={"agent": "nightly_report", "input": REPORT,
                                          "notify_url": bad}, headers=AUTH)  # fmt: skip
        assert refused.status_code == 422 and why in refused.json()["error"], refused.text
    # without the secret that signs the events, a notify_url is refused, saying which is missing
    monkeypatch.delenv("NIGHTSHIFT_NOTIFY_SECRET", raising=False)
    get_settings.cache_clear()
    with pytest.raises(InvalidInput, match="NIGHTSHIFT_NOTIFY_SECRET"):
        start_run("nightly_report", REPORT, notify_url="https://ops.example.com/hook")
    monkeypatch.setenv("NIGHTSHIFT_NOTIFY_SECRET", SECRET)
    get_settings.cache_clear()
    assert main(["start", "nightly_report", "--input", json.dumps(REPORT), "--notify-url",
                 "https://ops.example.com/hook", "--json"]) == 0  # fmt: skip
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    with transaction() as session:
        assert session.scalar(select(Run.notify_url).where(Run.id == uuid.UUID(run_id))) == (
            "https://ops.example.com/hook"
        )
