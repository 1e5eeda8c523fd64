"""A duplicate seen where it happens: a send whose reply was lost is resent under the same key,
the email service answers `Idempotent-Replayed: true`, and the run's record and /metrics both
say a duplicate was absorbed, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from models import RunStatus
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from pipeline.views.actions import show_action
from tests.integration.api_fixtures import AUTH, client
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.integration.test_prometheus import scrape
from tests.support import wait_for, wait_for_status

KEY = "nightly_report:2026-11-29:ops"
ABSORBED = "nightshift_duplicates_absorbed_total"


def test_a_resend_the_service_replays_counts_once_as_a_duplicate_absorbed(
    sandbox: Sandbox, processes: ProcessFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given an email API that honours keys, and a worker that dies after the send, before
    # saving its reply; workers and the API share one metrics directory
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(metrics)}
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics))
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", "keys")
    get_settings.cache_clear()
    doomed = processes("doomed", env={**env, "NIGHTSHIFT_CRASH_POINTS": "after_send_before_reply"})
    run_id = start_run("nightly_report", {"team": "ops", "date": "2026-11-29"}).run_id
    wait_for(doomed.exited, timeout=60, what="the worker to die after the send")
    assert len(sandbox.email.deliveries(KEY)) == 1

    # when a healthy worker resumes the run and resends under the same key
    processes("beat", beat=True, env=env)
    processes("healthy", env=env)
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=60)

    # then the service sent one email, and the run's record says it absorbed the resend
    assert row.status == RunStatus.SUCCEEDED
    assert len(sandbox.email.deliveries(KEY)) == 1
    action = show_action(KEY)
    assert (action["state"], action["attempts"]) == ("confirmed", 2)
    assert action["resolution"] == "replayed_by_service"
    # and /metrics counts it once, as Prometheus parses it
    samples = scrape(client().get("/metrics", headers=AUTH).text)
    assert samples[(ABSORBED, (("how", "replayed"), ("service", "email")))] == 1
    assert sum(v for (name, _), v in samples.items() if name == ABSORBED) == 1
