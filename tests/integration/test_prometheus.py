"""`/metrics` through prometheus_client: the counters real workers update where things happen
(in multi-process files the API adds up) and gauges from bounded queries, parsed by
prometheus_client's own parser."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from models import RunStatus
from pipeline.runs.start import start_run
from pipeline.sandbox.email import EmailSandbox
from pipeline.sandbox.web import WebSandbox
from pipeline.settings import get_settings
from tests.integration.api_fixtures import AUTH, client, park_on_approval
from tests.integration.conftest import ProcessFactory
from tests.support import wait_for_status

Sample = tuple[str, tuple[tuple[str, str], ...]]


def scrape(body: str) -> dict[Sample, float]:
    """Every sample of an exposition by (name, sorted labels), as Prometheus parses it."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


@pytest.fixture
def metrics_dir(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """Web and email services, and one metrics directory shared by the workers and the API."""
    web = WebSandbox(log_path=tmp_path / "web.jsonl").start()
    email = EmailSandbox(log_path=tmp_path / "email.jsonl").start()
    (tmp_path / "metrics").mkdir()
    monkeypatch.setenv("NIGHTSHIFT_WEB_URL", web.url)
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_URL", email.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    get_settings.cache_clear()
    yield {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics")}
    email.stop()
    web.stop()


REPORT = (("agent", "nightly_report"),)


def test_metrics_counts_what_two_workers_did_and_parses_as_prometheus_text(
    metrics_dir: dict[str, str], processes: ProcessFactory
) -> None:
    # given two worker processes sharing the metrics directory, and two finished reports
    processes("w1", env=metrics_dir)
    processes("w2", env=metrics_dir)
    for team in ("ops", "dev"):
        run_id = start_run("nightly_report", {"team": team, "date": "2026-11-29"}).run_id
        wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=60)
    # and a run waiting for a person's approval
    park_on_approval()

    # when Prometheus scrapes the API
    response = client().get("/metrics", headers=AUTH)
    assert response.headers["content-type"].startswith("text/plain; version=")
    samples = scrape(response.text)

    # then the counters add up both workers' files: 6 steps per report, 5 continued
    assert samples[("nightshift_steps_total", (*REPORT, ("outcome", "continue")))] == 10
    assert samples[("nightshift_steps_total", (*REPORT, ("outcome", "stopped")))] == 2
    assert samples[("nightshift_step_seconds_count", REPORT)] == 12
    assert samples[("nightshift_model_calls_total", (*REPORT, ("result", "ok")))] == 12
    assert samples[("nightshift_model_tokens_total", (*REPORT, ("kind", "input")))] > 0
    fetched = (*REPORT, ("result", "ok"), ("tool", "fetch_source"))
    assert samples[("nightshift_tool_calls_total", fetched)] == 6
    emailed = (*REPORT, ("tool", "send_report_email"))
    assert samples[("nightshift_tool_call_seconds_count", emailed)] == 2
    for state in ("intended", "attempted", "confirmed"):
        assert samples[("nightshift_action_transitions_total", (("state", state),))] == 2
    finished = (*REPORT, ("reason", "completed"), ("status", "succeeded"))
    assert samples[("nightshift_runs_finished_total", finished)] == 2
    # and the gauges come from the database and the broker
    waiting = (("agent", "patch"), ("status", "waiting"))
    assert samples[("nightshift_runs_active", waiting)] == 1
    assert samples[("nightshift_actions_open", (("state", "pending_approval"),))] == 1
    assert samples[("nightshift_workers_alive", (("queue", get_settings().queue),))] == 2
    assert samples[("nightshift_oldest_unclaimed_seconds", ())] == 0
    assert samples[("nightshift_queue_depth", (("queue", get_settings().queue),))] == 0
