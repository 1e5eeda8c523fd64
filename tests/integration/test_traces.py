"""OpenTelemetry: one trace from the caller's span to the run's last step, on real workers,
across a SIGKILL of the worker that ran the first steps. The caller records its span with the
SDK's in-memory exporter; the workers export theirs over OTLP to a collector in the test, set
up by the standard OTEL_* variables alone."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import propagate
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from models import RunStatus
from pipeline.app import app
from pipeline.runs.start import start_run
from pipeline.settings import get_settings
from pipeline.tasks import CONFIG_EXIT
from tests.integration.api_fixtures import AUTH, client
from tests.integration.conftest import ProcessFactory, Sandbox
from tests.otlp_collector import OtlpCollector, ReceivedSpan
from tests.support import run_row, wait_for, wait_for_status

REPORT = {"team": "ops", "date": "2026-11-29", "email_to": "night.owl@example.com"}
KEY = "nightly_report:2026-11-29:ops"


@pytest.fixture
def collector() -> Iterator[OtlpCollector]:
    received = OtlpCollector().start()
    yield received
    received.stop()


def exporting_to(collector: OtlpCollector) -> dict[str, str]:
    """A worker's environment: export every span to the collector at once (standard only)."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "20",
        "OTEL_SERVICE_NAME": "nightshift-worker",
    }


def caller_tracer() -> tuple[Any, InMemorySpanExporter]:
    """Another service's tracer, recording in memory (not this process's global provider)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("caller"), exporter


def run_spans(collector: OtlpCollector, run_id: uuid.UUID) -> list[ReceivedSpan]:
    return [s for s in collector.spans() if s.attributes.get("nightshift.run.id") == str(run_id)]


def traceparent_ids(trace_context: dict[str, str]) -> tuple[str, str]:
    """(trace id, span id) of a W3C traceparent `00-<trace>-<span>-<flags>`."""
    _, trace_id, span_id, _ = trace_context["traceparent"].split("-")
    return trace_id, span_id


def test_one_trace_from_a_send_task_caller_to_the_last_step_across_a_sigkill(
    sandbox: Sandbox,
    processes: ProcessFactory,
    collector: OtlpCollector,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a worker that dies (SIGKILL) after its send, before saving the reply, and a caller
    # that starts the run inside its own span, its traceparent in the message's headers
    monkeypatch.setenv("NIGHTSHIFT_EMAIL_MODE", "keys")
    get_settings.cache_clear()
    env = exporting_to(collector)
    doomed = processes("doomed", env={**env, "NIGHTSHIFT_CRASH_POINTS": "after_send_before_reply"})
    tracer, caller_spans = caller_tracer()
    with tracer.start_as_current_span("nightly job") as caller:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        sent = app.send_task("pipeline.start_run", args=["nightly_report", REPORT], headers=headers)
        run_id = uuid.UUID(sent.get(timeout=60))
    wait_for(doomed.exited, timeout=60, what="the worker to die after the send")

    # when a healthy worker takes the run over (the tick re-sends it) and finishes it
    processes("beat", beat=True, env=env)
    processes("healthy", env=env)
    row = wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=90)

    # then the run's row continues the caller's trace under the run's own span
    trace_id = format(caller.get_span_context().trace_id, "032x")
    caller_id = format(caller.get_span_context().span_id, "016x")
    assert [s.name for s in caller_spans.get_finished_spans()] == ["nightly job"]
    assert row.trace_context is not None
    row_trace, run_span_id = traceparent_ids(row.trace_context)
    assert row_trace == trace_id

    def last_step_exported() -> list[ReceivedSpan]:
        spans = run_spans(collector, run_id)
        done = any(s.attributes.get("nightshift.run.status") == "succeeded" for s in spans)
        return spans if done else []

    spans = wait_for(last_step_exported, timeout=30, what="the last step's span")
    # the run span: the caller's child, recorded by the worker that started the run
    (run_span,) = [s for s in spans if s.name == "run nightly_report"]
    assert (run_span.trace_id, run_span.span_id) == (trace_id, run_span_id)
    assert run_span.parent_span_id == caller_id
    # every step, on both workers, is a child of the run span in the same trace
    steps = [s for s in spans if s.name == "step nightly_report"]
    assert {(s.trace_id, s.parent_span_id) for s in steps} == {(trace_id, run_span_id)}
    healthy_steps = [s for s in steps if f":{doomed.pid}:" not in s.attributes["nightshift.worker"]]
    assert healthy_steps, "the worker that took over exported no step"
    last = [s for s in steps if s.attributes.get("nightshift.run.status") == "succeeded"]
    assert [s.attributes["nightshift.step"] for s in last] == [row.step - 1]
    assert f":{doomed.pid}:" not in last[0].attributes["nightshift.worker"]
    # the takeover redid the step the SIGKILL cut short, at a later fence
    redone = min(healthy_steps, key=lambda s: s.attributes["nightshift.fence"])
    assert redone.attributes["nightshift.fence"] > 1

    # and the model calls, tool calls and the send are spans of the same trace
    everything = [s for s in collector.spans() if s.trace_id == trace_id]
    chats = [s for s in everything if s.name.startswith("chat ")]
    assert chats and all(s.attributes["gen_ai.usage.output_tokens"] > 0 for s in chats)
    assert all(s.attributes["gen_ai.request.model"] for s in chats)
    assert {r for s in chats for r in s.attributes["gen_ai.response.finish_reasons"]} >= {
        "tool_use",
        "end_turn",
    }
    assert any(s.name.startswith("execute_tool ") for s in everything)
    sends = [s for s in everything if s.name == "send email"]
    confirmed = [s for s in sends if s.attributes.get("nightshift.action.state") == "confirmed"]
    assert [s.attributes["nightshift.action.key"] for s in confirmed] == [KEY]
    assert confirmed[0].attributes["nightshift.action.resolution"] == "replayed_by_service"
    # never the tool's arguments (the recipient), the report's text or the model key
    values = repr([(s.name, s.attributes) for s in everything])
    assert "night.owl" not in values
    assert "test-key-not-secret" not in values
    assert "input" not in {key.split(".")[-1] for s in everything for key in s.attributes}


def test_the_api_carries_a_traceparent_into_the_run_with_tracing_off_there(
    sandbox: Sandbox, processes: ProcessFactory, collector: OtlpCollector
) -> None:
    # given an API process that records nothing, and a worker that exports
    processes("w1", env=exporting_to(collector))
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    traceparent = f"00-{trace_id}-{parent_id}-01"

    # when a caller starts a run with its traceparent header
    answer = client().post(
        "/runs",
        json={"agent": "nightly_report", "input": {"team": "ops", "date": "2026-11-30"}},
        headers={**AUTH, "traceparent": traceparent},
    )
    assert answer.status_code == 201, answer.text
    run_id = uuid.UUID(answer.json()["run_id"])
    wait_for_status(run_id, {RunStatus.SUCCEEDED.value}, timeout=60)

    # then the run keeps the caller's context as it came, and every step continues it
    assert run_row(run_id).trace_context["traceparent"] == traceparent

    def steps(run_id: uuid.UUID) -> Callable[[], list[ReceivedSpan]]:
        def finished() -> list[ReceivedSpan]:
            spans = [s for s in run_spans(collector, run_id) if s.name.startswith("step ")]
            done = any(s.attributes.get("nightshift.run.status") == "succeeded" for s in spans)
            return spans if done else []

        return finished

    exported = wait_for(steps(run_id), timeout=30, what="the run's step spans")
    assert {(s.trace_id, s.parent_span_id) for s in exported} == {(trace_id, parent_id)}

    # and a run started outside any trace still makes one: its id is the run's
    untraced = start_run("nightly_report", {"team": "ops", "date": "2026-12-01"}).run_id
    wait_for_status(untraced, {RunStatus.SUCCEEDED.value}, timeout=60)
    assert run_row(untraced).trace_context is None
    exported = wait_for(steps(untraced), timeout=30, what="the untraced run's step spans")
    assert {s.trace_id for s in exported} == {untraced.hex}


def test_a_worker_told_to_export_to_an_exporter_nobody_provides_stops_at_start(
    db_url: str, processes: ProcessFactory
) -> None:
    worker = processes("w1", wait=False, env={"OTEL_TRACES_EXPORTER": "zipkin_json"})
    wait_for(worker.exited, timeout=60, what="the worker to stop")
    assert worker.process is not None
    log = worker.log()
    assert worker.process.returncode == CONFIG_EXIT, log
    assert "worker stops: OTEL_TRACES_EXPORTER names 'zipkin_json'" in log
    assert "Traceback" not in log
