"""Budget alerts' webhooks go through the action protocol like completion webhooks: owed in the
alert's fenced transaction, `attempted` before the POST, retried, and delivered exactly once per
`Idempotency-Key` even when the worker is SIGKILLed right after sending one; `nightshift alerts`
shows each one's delivery."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import select, update

from models import Action, ActionState, Alert, RunStatus
from pipeline.cli.main import main
from pipeline.db import transaction
from pipeline.engine.budgets import raise_alert_txn
from pipeline.runs.start import start_run
from pipeline.sandbox.hooks import HookSandbox
from pipeline.settings import get_settings
from tests.integration.api_fixtures import client
from tests.integration.conftest import ProcessFactory
from tests.integration.test_notify import SECRET
from tests.integration.test_status_page import sign_in
from tests.support import Webhook, wait_for, wait_for_status, webhooks

CAP = 3_000


@pytest.fixture
def receiver(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HookSandbox]:
    """An alert receiver on 127.0.0.1 (NIGHTSHIFT_NOTIFY_ALLOWED left at its default: the
    alert URL is the operator's), honouring Idempotency-Key; a nightly token cap that warns at
    half of it; the scripted model."""
    hooks = HookSandbox(secret=SECRET, log_path=tmp_path / "hooks.jsonl").start()
    monkeypatch.setenv("NIGHTSHIFT_ALERT_WEBHOOK_URL", f"{hooks.url}/hooks/alerts")
    monkeypatch.setenv("NIGHTSHIFT_NOTIFY_SECRET", SECRET)
    monkeypatch.delenv("NIGHTSHIFT_NOTIFY_ALLOWED", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("NIGHTSHIFT_NIGHTLY_TOKEN_CAP", str(CAP))
    monkeypatch.setenv("NIGHTSHIFT_NIGHTLY_ALERT_AT", "0.5")
    get_settings.cache_clear()
    yield hooks
    hooks.stop()


def deliveries() -> list[Webhook]:
    return webhooks(Action.tool == "alert")


@pytest.mark.timeout(240)
def test_an_alert_is_delivered_once_when_the_worker_dies_right_after_its_post(
    receiver: HookSandbox,
    processes: ProcessFactory,
    register_agents: Callable[..., None],
    capsys: pytest.CaptureFixture[str],
    duplicate_report: list[int],
) -> None:
    # given a run that spends until the night's cap, on a worker that dies right after the
    # first webhook POST it makes (the night's warning), before it can save the answer
    register_agents("tests.fixture_agents:ENDLESS")
    processes("beat", beat=True)
    doomed = processes("doomed", env={"NIGHTSHIFT_CRASH_POINTS": "after_notify_sent"})
    run_id = start_run("endless_shout", {"word": "a"}).run_id

    # when the warning is posted and the worker is killed
    wait_for(doomed.exited, timeout=120, what="the worker to die after the alert's POST")
    # (the cap's alert may have gone out beside the warning: the senders work in parallel, and
    # the first POST to end kills the worker)
    assert receiver.deliveries()[0]["body"]["kind"] in ("nightly_budget_warning", "nightly_budget")
    cut_off = {
        n.key
        for n in deliveries()
        if n.state is ActionState.ATTEMPTED and receiver.deliveries(n.key)
    }
    assert cut_off, "a POST went out whose answer was never saved"

    # then a healthy worker finishes the night: the run stops at the cap, with its alert
    processes("healthy")
    row = wait_for_status(run_id, {RunStatus.FAILED.value}, timeout=120)
    assert row.stop_reason == "nightly_budget"

    def all_confirmed() -> list[Webhook] | None:
        found = deliveries()
        done = len(found) == 2 and all(n.state is ActionState.CONFIRMED for n in found)
        return found if done else None

    sent = wait_for(all_confirmed, timeout=60, what="both alerts' webhooks to be confirmed")
    # and the receiver took each alert once: one cut off sent again with its key, a replay
    with transaction() as session:
        alerts = {a.id: a for a in session.scalars(select(Alert))}
    keys = [f"alert:{n.alert_id}" for n in sent]
    assert [n.key for n in sent] == keys
    for notification in sent:
        if notification.key in cut_off:
            assert notification.attempts == 2  # again after the kill
            actions = [r["action"] for r in receiver.requests(notification.key)]
            assert actions == ["delivered", "replayed"]
    duplicate_report.append(sum(len(receiver.deliveries(key)) - 1 for key in keys))
    assert [len(receiver.deliveries(key)) for key in keys] == [1, 1]
    for notification, key in zip(sent, keys, strict=True):
        [delivery] = receiver.deliveries(key)
        alert = alerts[notification.alert_id]
        assert delivery["signature_ok"] is True and delivery["event"] == "alert"
        body = delivery["body"]
        assert (body["id"], body["kind"], body["subject"]) == (key, alert.kind, alert.subject)
        assert body["message"] == alert.message
    assert [alerts[n.alert_id].kind for n in sent] == ["nightly_budget_warning", "nightly_budget"]

    # and `nightshift alerts` shows both, each delivered
    capsys.readouterr()
    assert main(["alerts", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    said = {n.alert_id: "confirmed" + (f" ({n.attempts} attempts)" if n.attempts > 1 else "")
            for n in sent}  # fmt: skip
    assert [(a["kind"], a["delivery"]) for a in listed] == [
        ("nightly_budget", said[sent[1].alert_id]),
        ("nightly_budget_warning", said[sent[0].alert_id]),
    ]
    assert listed[1]["webhook"]["idempotency_key"] == keys[0]


def test_the_status_page_shows_each_alert_with_its_webhooks_delivery(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given one alert raised with no webhook URL, and one with a URL whose delivery failed
    with transaction() as session:
        raise_alert_txn(session, get_settings(), "budget_max_cost", "run:x", "cost <b>$1</b>")
    monkeypatch.setenv("NIGHTSHIFT_ALERT_WEBHOOK_URL", "https://hooks.example.com/a?token=t0p")
    with transaction() as session:
        raise_alert_txn(session, get_settings(), "nightly_budget", "night:2026-11-29", "stopped")
        session.execute(
            update(Action).values(state=ActionState.FAILED, attempts=12, error="HTTP 503")
        )
    # when a person looks at the dashboard
    api = client()
    sign_in(api)
    page = api.get("/ui").text
    # then each alert says what became of its webhook, and nothing of the URL's secret
    rows = re.findall(r'<tr class="alert" data-kind="([^"]+)">(.*?)</tr>', page, re.S)
    shown = {kind: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)) for kind, row in rows}
    assert "failed (12 attempts)" in shown["nightly_budget"]
    assert "not sent" in shown["budget_max_cost"]
    assert "cost &lt;b&gt;$1&lt;/b&gt;" in page  # escaped, never markup
    assert "t0p" not in page
