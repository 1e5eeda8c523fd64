"""Tracing is off unless the standard OTEL_* variables say where spans go; a caller's
traceparent is carried into its runs either way; a wrong exporter is one clear line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from pipeline import tracing
from pipeline.errors import SettingsError

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def configured(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` after tracing.configure() in a fresh process (a tracer provider is set once a
    process), with only these OTEL_* variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    program = f"from pipeline import tracing\nprint(tracing.configure())\n{code}"
    return subprocess.run(
        [sys.executable, "-c", program], env=clean | env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def test_nothing_is_recorded_unless_an_exporter_is_named() -> None:
    assert configured("").stdout.split() == ["False"]
    assert configured("", OTEL_TRACES_EXPORTER="none").stdout.split() == ["False"]
    disabled = configured("", OTEL_TRACES_EXPORTER="console", OTEL_SDK_DISABLED="true")
    assert disabled.stdout.split() == ["False"]


def test_an_exporter_named_by_the_standard_variable_gets_the_runs_spans() -> None:
    # given the SDK's console exporter, named as any exporter package's entry point is
    code = (
        "import uuid\n"
        "tracing.run_contexts('nightly_report', [uuid.UUID(int=7)], 'night-1')\n"
        "tracing.flush()\n"
    )
    done = configured(code, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="night-api")
    assert done.returncode == 0, done.stderr
    # then the run's span is exported, with the service named by OTEL_SERVICE_NAME
    printed = done.stdout.split("\n", 1)
    assert printed[0] == "True"
    span = json.loads(printed[1])
    assert span["name"] == "run nightly_report"
    assert span["attributes"]["nightshift.run.id"] == str(uuid.UUID(int=7))
    assert span["attributes"]["nightshift.batch.id"] == "night-1"
    assert span["resource"]["attributes"]["service.name"] == "night-api"


def test_an_exporter_nobody_provides_is_refused_in_one_line() -> None:
    done = configured("", OTEL_TRACES_EXPORTER="zipkin_json")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "OTEL_TRACES_EXPORTER names 'zipkin_json'" in last
    assert "console" in last  # what is installed


def test_otlp_follows_its_protocol_variable() -> None:
    env = {"OTEL_TRACES_EXPORTER": "otlp"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        patch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
        patch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
        assert tracing.exporter_names() == ["otlp_proto_http"]
        patch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        assert tracing.exporter_names() == ["otlp_proto_grpc"]
        patch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
        with pytest.raises(SettingsError, match="'http/json' is not one of"):
            tracing.exporter_names()


def test_with_tracing_off_a_run_keeps_its_callers_context_as_it_came() -> None:
    ids = [uuid.uuid4(), uuid.uuid4()]
    assert tracing.run_contexts("nightly_report", ids, None) is None
    with tracing.continuing({"traceparent": TRACEPARENT}):
        kept = tracing.run_contexts("nightly_report", ids, None)
    assert kept == [{"traceparent": TRACEPARENT}] * 2
    with tracing.continuing({"traceparent": "not a traceparent"}):
        assert tracing.run_contexts("nightly_report", ids, None) is None
