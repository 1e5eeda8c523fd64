"""Migration 0039 moves the notifications table's rows to actions (kind `webhook`) with their
keys and states: a webhook delivered before the upgrade is never sent again after it, and one
still owed is sent after it, once, under the key it had."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, text

from models import ActionState, RunStatus
from pipeline.db import dispose_all, transaction
from pipeline.delivery.sender import Delivery, deliver
from pipeline.migrate import alembic_config, fresh_database, upgrade
from pipeline.runs.start import start_run
from pipeline.runs.tick import tick
from pipeline.sandbox.hooks import HookSandbox
from tests.integration.test_notify import REPORT, SECRET, set_status
from tests.support import ServiceUrls, webhooks


@pytest.fixture
def before_0039(
    services: ServiceUrls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A database at 0038 as the older release left it (the notifications table, and the
    functions that write it), which the settings point at. Reached through 0039's downgrade:
    the migrations before 0039 apply today's schema.sql, whose functions write actions."""
    name = f"ns_t_webhooks_{uuid.uuid4().hex[:8]}"
    with fresh_database(services.database_url(name)) as url:
        upgrade(url)
        _downgrade(url, "0038")
        monkeypatch.setenv("NIGHTSHIFT_DATABASE_URL", url)
        monkeypatch.setenv("NIGHTSHIFT_DATA_DIR", str(tmp_path / "data"))
        try:
            yield url
        finally:
            dispose_all()


def _downgrade(url: str, revision: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            config = alembic_config(url)
            config.attributes["connection"] = connection  # as pipeline.migrate.upgrade does
            command.downgrade(config, revision)
    finally:
        engine.dispose()


def test_a_webhook_delivered_before_the_upgrade_is_not_sent_again_after_it(
    before_0039: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = HookSandbox(secret=SECRET, log_path=tmp_path / "hooks.jsonl").start()
    try:
        monkeypatch.setenv("NIGHTSHIFT_NOTIFY_SECRET", SECRET)
        monkeypatch.setenv("NIGHTSHIFT_NOTIFY_ALLOWED", "127.0.0.1")
        url = f"{receiver.url}/hooks/ops"
        # given two runs that finished under the older release: the first one's webhook was
        # delivered (its row confirmed, as the older sender left it), the second's still owed
        delivered, owed = (
            start_run("nightly_report", {**REPORT, "date": day}, notify_url=url).run_id
            for day in ("2026-11-28", "2026-11-29")
        )
        for run_id in (delivered, owed):
            set_status(run_id, RunStatus.SUCCEEDED)
        with transaction() as session:
            moved = session.execute(
                text(
                    "UPDATE notifications SET state = 'confirmed', attempts = 1, "
                    "response_status = 200, body = '{}', first_attempt_at = now(), "
                    "last_attempt_at = now() WHERE run_id = :id"
                ),
                {"id": delivered},
            ).rowcount
        assert moved == 1

        # when the database is upgraded and the new release's tick and senders run
        dispose_all()
        upgrade(before_0039)
        due = tick().notified
        outcomes = {key: deliver(key) for key in (f"run:{delivered}:finished", *due)}

        # then the delivered one kept its key, state and reply, and nothing was sent for it
        first, second = webhooks()
        assert (first.key, first.state, first.attempts, first.response_status) == (
            f"run:{delivered}:finished", ActionState.CONFIRMED, 1, 200,
        )  # fmt: skip
        assert (first.event, first.url, first.run_id) == ("run.finished", url, delivered)
        assert due == [f"run:{owed}:finished"]
        assert outcomes[first.key] is Delivery.SKIPPED
        # and the owed one was sent once, under the key it had before the upgrade
        assert outcomes[second.key] is Delivery.DELIVERED
        assert (second.key, second.state) == (f"run:{owed}:finished", ActionState.CONFIRMED)
        assert [d["key"] for d in receiver.deliveries()] == [second.key]
        assert receiver.deliveries()[0]["body"]["run"]["id"] == str(owed)
        assert tick().notified == []
    finally:
        receiver.stop()
