"""OpenTelemetry traces: a span per run, step, model call, tool call and send, in one trace from
the caller that started the run to its last step, on whichever workers ran it.

Nothing is recorded unless this process is set up to export, by the standard variables:
OTEL_TRACES_EXPORTER names an exporter (`otlp`, `console`, or any exporter package's entry
point) and OTEL_SDK_DISABLED is not true; or the process already runs under an SDK tracer
provider (`opentelemetry-instrument`, or the host application's own setup). Otherwise each
helper here costs one check, and a caller's `traceparent` is still carried into the run, so
that workers that do export continue the caller's trace.

Spans carry ids, names, counts and states, never a tool's arguments, a model's text or an
exception's message (which may quote either): an error is its type's name.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from pipeline.errors import SettingsError

TRACER = "nightshift"
SERVICE = "nightshift"
"""service.name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one."""

_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_EXPORTERS = "opentelemetry_traces_exporter"

_tracer: trace.Tracer | None = None
"""This process's tracer once configure() found tracing on; None: every span helper is a no-op."""


def configure() -> bool:
    """Set tracing up for this process (a worker, the API, the CLI), once: whether it records.

    A tracer provider the process already has (opentelemetry-instrument's, the application's)
    is used as it is. Else OTEL_TRACES_EXPORTER decides: unset or `none`, nothing is recorded
    (unlike the SDK's own default of `otlp`: no collector is assumed); otherwise the SDK is set
    up from the standard variables (resource, sampler, batch processor, each exporter's own).
    """
    global _tracer
    if _tracer is not None:
        return True
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        names = exporter_names()
        if not names or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return False
        provider = _sdk_provider(names)
        trace.set_tracer_provider(provider)
    _tracer = provider.get_tracer(TRACER)
    return True


def exporter_names() -> list[str]:
    """The entry points OTEL_TRACES_EXPORTER names; `otlp` as its protocol variable says
    (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL; http/protobuf,
    the specification's default, when neither is set)."""
    value = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not value or value.lower() == "none":
        return []
    names = []
    for name in (part.strip() for part in value.split(",")):
        if name == "otlp":
            protocol = (
                os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf"
            ).strip()
            if protocol not in _OTLP_BY_PROTOCOL:
                raise SettingsError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not one of "
                    f"{', '.join(_OTLP_BY_PROTOCOL)}"
                )
            name = _OTLP_BY_PROTOCOL[protocol]
        if name:
            names.append(name)
    return names


def _sdk_provider(names: list[str]) -> Any:
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise SettingsError(
            "OTEL_TRACES_EXPORTER is set but the OpenTelemetry SDK is not installed: "
            "pip install 'nightshift[otel]'"
        ) from None
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
    provider = TracerProvider(resource=resource)  # OTEL_TRACES_SAMPLER and its argument
    for name in names:
        # Each exporter reads its own variables (OTEL_EXPORTER_OTLP_ENDPOINT, headers...), the
        # batch processor OTEL_BSP_*.
        provider.add_span_processor(BatchSpanProcessor(_exporter(name)()))
    return provider


def _exporter(name: str) -> Any:
    found = entry_points(group=_EXPORTERS, name=name)
    if not found:
        known = ", ".join(sorted(ep.name for ep in entry_points(group=_EXPORTERS))) or "none"
        raise SettingsError(
            f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides "
            f"(installed: {known}); pip install 'nightshift[otel]' brings otlp"
        )
    return next(iter(found)).load()


def flush() -> None:
    """Export what this process still holds (a worker that stops; its pool's children)."""
    if _tracer is not None:
        force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
        if force_flush is not None:
            force_flush()


# -- carrying a trace ------------------------------------------------------------------------


@contextmanager
def continuing(carrier: Any) -> Iterator[None]:
    """Within: the trace context a caller sent (a message's headers, an HTTP request's: any
    mapping with `.get`, W3C `traceparent` by default, as OTEL_PROPAGATORS says) is the
    current one, so that runs started here belong to the caller's trace."""
    if not any(carrier.get(field) for field in propagate.get_global_textmap().fields):
        yield
        return
    token = otel_context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        otel_context.detach(token)


def inject_into_message(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Celery's before_task_publish: a task sent within a trace carries its context in the
    message's headers (a start handed on to another worker stays in its caller's trace)."""
    if headers is not None and "traceparent" not in headers:
        propagate.inject(headers)


def run_contexts(
    agent: str, ids: Sequence[uuid.UUID], batch_id: str | None
) -> list[dict[str, str]] | None:
    """What runs.trace_context keeps for each new run: its run span's context, the span
    started (and ended) here as a child of the current span, the caller's. With tracing off,
    the caller's own context when one was carried in (every run the same), else None."""
    if _tracer is None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return [carrier] * len(ids) if carrier else None
    contexts = []
    for run_id in ids:
        attributes = {"nightshift.run.id": str(run_id), "nightshift.agent": agent}
        if batch_id is not None:
            attributes["nightshift.batch.id"] = batch_id
        span = _tracer.start_span(f"run {agent}", kind=SpanKind.PRODUCER, attributes=attributes)
        span.end()  # the steps, on other workers and days, hang under it
        carrier = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        contexts.append(carrier)
    return contexts


# -- spans -----------------------------------------------------------------------------------


_OFF: AbstractContextManager[None] = nullcontext()
"""What every span helper returns with tracing off (reusable: it holds nothing)."""


@contextmanager
def _span(
    name: str,
    attributes: dict[str, Any],
    kind: SpanKind = SpanKind.INTERNAL,
    parent: otel_context.Context | None = None,
) -> Iterator[Span | None]:
    assert _tracer is not None  # the helpers return _OFF without one
    with _tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=attributes,
        # An exception's message may quote a tool's arguments: only its type is recorded.
        record_exception=False, set_status_on_exception=False,
    ) as span:  # fmt: skip
        try:
            yield span
        except Exception as exc:
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR))
            raise
        except BaseException as exc:  # a stop (a park, a lost lease, a cancel): no error
            span.set_attribute("nightshift.stopped_by", type(exc).__name__)
            raise


def step_span(
    trace_context: Mapping[str, str] | None,
    run_id: uuid.UUID,
    agent: str,
    step: int,
    worker: str,
    fence: int,
    taken_from: str | None,
) -> AbstractContextManager[Span | None]:
    """One attempt of a step, a child of its run's span (runs.trace_context) whichever worker
    claims it; a takeover names the holder it took the run from."""
    if _tracer is None:
        return _OFF
    attributes: dict[str, Any] = {
        "nightshift.run.id": str(run_id),
        "nightshift.agent": agent,
        "nightshift.step": step,
        "nightshift.worker": worker,
        "nightshift.fence": fence,
    }
    if taken_from is not None:
        attributes["nightshift.taken_from"] = taken_from
    parent = propagate.extract(trace_context) if trace_context else _run_trace(run_id)
    return _span(f"step {agent}", attributes, SpanKind.CONSUMER, parent)


def _run_trace(run_id: uuid.UUID) -> otel_context.Context:
    """The parent of the steps of a run started outside any trace: a remote span whose trace
    id is the run's id (128 bits both), so that its steps still make one trace, found by it."""
    parent = trace.SpanContext(
        trace_id=run_id.int,
        span_id=run_id.int & 0xFFFF_FFFF_FFFF_FFFF or 1,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def model_call(model: str, agent: str) -> AbstractContextManager[Span | None]:
    """A call to the model: a client span named as OpenTelemetry's GenAI conventions say."""
    if _tracer is None:
        return _OFF
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": model,
        "nightshift.agent": agent,
    }
    return _span(f"chat {model}", attributes, SpanKind.CLIENT)


def model_replied(span: Span | None, reply: Mapping[str, Any]) -> None:
    """The reply's model, tokens and stop reason (never its content)."""
    if span is None:
        return
    usage = reply.get("usage") or {}
    span.set_attributes(
        {
            "gen_ai.response.model": str(reply.get("model") or ""),
            "gen_ai.usage.input_tokens": int(usage.get("input_tokens") or 0),
            "gen_ai.usage.output_tokens": int(usage.get("output_tokens") or 0),
            "gen_ai.response.finish_reasons": [str(reply.get("stop_reason") or "")],
        }
    )


def tool_call(name: str, tool_use_id: str) -> AbstractContextManager[Span | None]:
    """A tool call that runs (one replayed from the journal has none); never its arguments."""
    if _tracer is None:
        return _OFF
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": tool_use_id,
    }
    return _span(f"execute_tool {name}", attributes)


def send(key: str, service: str) -> AbstractContextManager[Span | None]:
    """One send of a side effect, under its idempotency key; its state once it is known."""
    if _tracer is None:
        return _OFF
    attributes = {"nightshift.action.key": key, "nightshift.action.service": service}
    return _span(f"send {service}", attributes, SpanKind.CLIENT)


def annotate(span: Span | None, name: str, value: str | int | bool) -> None:
    """One attribute on a span that may be off (None)."""
    if span is not None:
        span.set_attribute(name, value)


def mark(attributes: Mapping[str, str | int | bool]) -> None:
    """Attributes on the current span (a step's, a send's), when tracing is on."""
    if _tracer is not None:
        trace.get_current_span().set_attributes(attributes)
