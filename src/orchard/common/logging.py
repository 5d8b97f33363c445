"""One structlog set-up for every service: JSON lines on stderr.

Every line carries ``service`` and, while a call is being served, the ids the
observability interceptor (``orchard.common.observability``) and the services
bind with :func:`bind_call`: ``request_id``, ``rpc``, ``tenant``,
``sandbox_id``, plus ``trace_id``/``span_id`` of the current OpenTelemetry span
when tracing is on. A line therefore says who asked, about which sandbox, and
which trace to open, without each log call repeating it::

    {"service": "scheduler", "request_id": "6f0c...", "rpc": "CreateSandbox",
     "tenant": "team-a", "sandbox_id": "sb-...", "event": "sandbox ready", ...}

The ids live in contextvars, so they follow a call across ``await`` and into
tasks it starts, and never leak into another call.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog
from opentelemetry import trace


def _add_trace_ids(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event.setdefault("span_id", format(ctx.span_id, "016x"))
    return event


class LossyStream:
    """A log stream that drops what it cannot write instead of raising.

    ``orchard up`` sends each service's stderr to ``<home>/logs``; when that disk
    is full a write raises ENOSPC, and a raising log call turned every RPC that
    logged into UNKNOWN "Unexpected OSError". A lost log line is never worth
    failing the call that logs it; ``dropped`` counts what was lost.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.dropped = 0

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            self.dropped += 1
            return 0

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self.dropped += 1


def configure_logging(service: str, level: int = logging.INFO) -> None:
    """Set up structlog for the process ``service`` ("gateway", "scheduler", "executor")."""

    def add_service(
        _logger: Any, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event.setdefault("service", service)
        return event

    structlog.configure(
        processors=[
            add_service,
            structlog.contextvars.merge_contextvars,
            _add_trace_ids,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(LossyStream(sys.stderr)),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


def bind_call(**ids: str) -> None:
    """Bind ids (tenant, sandbox_id, ...) to every log line of the current call; empty values are skipped."""
    structlog.contextvars.bind_contextvars(**{k: v for k, v in ids.items() if v})
