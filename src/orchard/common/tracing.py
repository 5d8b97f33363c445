"""OpenTelemetry traces: set-up, and trace context carried in gRPC metadata.

Off by default: with nothing configured no SDK provider is installed, spans are
the API's non-recording ones and the interceptors skip their work, so a call
pays nothing. Turned on per process by the environment:

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``ORCHARD_OTLP_ENDPOINT``): batch-export
  spans over OTLP/gRPC to a collector (Jaeger, Tempo, the OTel collector);
- ``ORCHARD_TRACE_FILE``: append every finished span as one JSON line to that
  file (handy on one machine and in tests of real processes).

The context travels as W3C ``traceparent``/``tracestate`` gRPC metadata: the
server interceptor (``observability``) extracts it and opens the server span;
``observability.OutgoingContextInterceptor`` injects the current one into outgoing
calls (gateway -> scheduler, gateway -> executor). The scheduler opens a
``backend.create``/``backend.delete`` span around backend work, and a client
that sends its own ``traceparent`` (to the gateway, and to the executor on the
data plane) gets one trace across gateway -> scheduler -> backend -> executor.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

TRACER_NAME = "orchard"
_state = {"enabled": False}


def tracing_enabled() -> bool:
    return _state["enabled"]


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


class JsonLinesSpanExporter(SpanExporter):
    """Finished spans as JSON lines in a file (one writer per process, appends)."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8", buffering=1 << 20)  # noqa: SIM115
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        text = "".join(json.dumps(span_record(s), sort_keys=True) + "\n" for s in spans)
        with self._lock:  # one write per export: lines of several processes do not interleave
            self._file.write(text)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as a small JSON-able dict (what docs/operations.md shows)."""
    ctx = span.get_span_context()
    assert ctx is not None
    return {
        "name": span.name,
        "service": span.resource.attributes.get("service.name", ""),
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
        "start_ns": span.start_time,
        "duration_ms": round(((span.end_time or 0) - (span.start_time or 0)) / 1e6, 3),
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
    }


def configure_tracing(
    service: str,
    exporter: SpanExporter | None = None,
    environ: dict[str, str] | None = None,
) -> TracerProvider | None:
    """Install a tracer provider for ``service`` if tracing is configured; None when it stays off.

    ``exporter`` (tests: an in-memory exporter) turns tracing on regardless of
    the environment. OpenTelemetry allows one provider per process, so the
    first call wins; later calls only add their exporter.
    """
    env = os.environ if environ is None else environ
    processors: list[Any] = []
    if exporter is not None:
        processors.append(SimpleSpanProcessor(exporter))
    endpoint = env.get("ORCHARD_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        processors.append(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace_file = env.get("ORCHARD_TRACE_FILE")
    if trace_file:
        processors.append(SimpleSpanProcessor(JsonLinesSpanExporter(trace_file)))
    if not processors:
        return None
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        provider = current
    else:
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        trace.set_tracer_provider(provider)
    for processor in processors:
        provider.add_span_processor(processor)
    _state["enabled"] = True
    return provider


def shutdown_tracing() -> None:
    """Flush and stop exporters (graceful shutdown)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


# ---- context in gRPC metadata -------------------------------------------------


class _MetadataGetter:
    def get(self, carrier: dict[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        return None if value is None else [value]

    def keys(self, carrier: dict[str, str]) -> list[str]:
        return list(carrier)


_GETTER = _MetadataGetter()


def extract_context(metadata: dict[str, str]) -> otel_context.Context:
    """The trace context a caller sent (``traceparent`` metadata), or an empty one."""
    return propagate.extract(metadata, getter=_GETTER)  # type: ignore[arg-type]


def context_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as gRPC metadata pairs (empty when off or no span)."""
    if not tracing_enabled():
        return ()
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())


@contextmanager
def span(name: str, **attributes: str | int | float) -> Iterator[trace.Span]:
    """A child span of the current one (a no-op span when tracing is off)."""
    with tracer().start_as_current_span(name, attributes=attributes) as current:
        yield current
