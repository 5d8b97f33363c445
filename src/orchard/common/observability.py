"""The gRPC interceptors that give every call its ids, its span and its metrics.

:class:`ServerObservability` wraps each service's handlers once, so no
servicer repeats the work:

- **ids**: ``request_id`` (the caller's ``x-request-id`` if well-formed, else a
  new one), ``rpc`` and the sandbox id found in the request are bound to the
  call's log context (``orchard.common.logging``);
- **trace**: when tracing is on, the caller's ``traceparent`` is extracted and
  a SERVER span named after the method wraps the handler;
- **metrics**: ``orchard_rpc_requests_total`` / ``orchard_rpc_seconds``, and on
  the executor the ``exec`` and ``first_exec`` phases.

:class:`OutgoingContextInterceptor` is the client half: it carries the
current ``x-request-id`` and trace context on calls a service makes (the
gateway to the scheduler and to executors), so one request id and one trace
follow a call across processes.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog
from opentelemetry import trace

from . import tracing
from .logging import bind_call
from .metrics import PHASE_SECONDS, RPC_REQUESTS, RPC_SECONDS

REQUEST_ID_KEY = "x-request-id"
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
EXEC_METHODS = frozenset({"Run", "Exec", "SessionRun"})


def new_request_id() -> str:
    return os.urandom(8).hex()  # 64 random bits; ~6x cheaper than uuid4 per call


def _request_id_of(metadata: Any) -> str:
    """The first ``x-request-id`` value (what ``_metadata_dict`` would keep), or ""."""
    for key, value in metadata or ():
        if key == REQUEST_ID_KEY and isinstance(value, str):
            return value
    return ""


def _metadata_dict(metadata: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in metadata or ():
        if isinstance(value, str):
            out.setdefault(str(key), value)
    return out


# Per (message class, service): the attribute path to the sandbox id, found once
# from the class's descriptor. getattr of a field a message lacks raises inside
# (several us per call); a known path is a plain attribute read.
_SANDBOX_ID_PATHS: dict[tuple[type, str], tuple[str, ...] | None] = {}


def _sandbox_id_path(cls: type, service: str) -> tuple[str, ...] | None:
    """The string field holding the sandbox id, () for none, None if not a protobuf message."""
    descriptor = getattr(cls, "DESCRIPTOR", None)
    fields: Any = getattr(descriptor, "fields_by_name", None)
    if fields is None or not hasattr(fields, "get"):
        return None

    def is_string(field: Any) -> bool:
        return field is not None and field.type == field.TYPE_STRING and not _repeated(field)

    if "sandbox_id" in fields:
        return ("sandbox_id",) if is_string(fields["sandbox_id"]) else None
    start = fields.get("start")
    if start is not None:
        if start.message_type is None or _repeated(start):
            return None
        inner = start.message_type.fields_by_name.get("sandbox_id")
        return ("start", "sandbox_id") if is_string(inner) else None
    if service != "executor" and "id" in fields:
        return ("id",) if is_string(fields["id"]) else None
    return ()


def _repeated(field: Any) -> bool:
    is_repeated = getattr(field, "is_repeated", None)
    if isinstance(is_repeated, bool):
        return is_repeated
    return bool(field.label == field.LABEL_REPEATED)


def sandbox_id_of(request: Any, service: str) -> str:
    """The sandbox a request names (``sandbox_id``, ``start.sandbox_id``, or ``id`` on SandboxService)."""
    key = (type(request), service)
    try:
        path = _SANDBOX_ID_PATHS[key]
    except KeyError:
        path = _SANDBOX_ID_PATHS[key] = _sandbox_id_path(type(request), service)
    if path is None:
        return _sandbox_id_by_getattr(request, service)
    value: Any = request
    for name in path:
        value = getattr(value, name)
    return value[:80] if path else ""


def _sandbox_id_by_getattr(request: Any, service: str) -> str:
    """``sandbox_id_of`` for objects that are not protobuf messages."""
    value = getattr(request, "sandbox_id", None)
    if isinstance(value, str):
        return value[:80]
    start = getattr(request, "start", None)
    value = getattr(start, "sandbox_id", None)
    if isinstance(value, str):
        return value[:80]
    if service != "executor":
        value = getattr(request, "id", None)
        if isinstance(value, str):
            return value[:80]
    return ""


class _FirstExecs:
    """Which sandboxes already ran a command here (bounded: old entries are forgotten)."""

    def __init__(self, capacity: int = 65_536) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def first(self, sandbox_id: str) -> bool:
        if not sandbox_id or sandbox_id in self._seen:
            return False
        self._seen[sandbox_id] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return True


class _Call:
    """Per-call bookkeeping shared by the four handler shapes."""

    __slots__ = ("first_exec", "method", "span_cm", "started")

    def __init__(
        self, owner: ServerObservability, method: str, context: Any, sandbox_id: str = ""
    ) -> None:
        self.method = method
        self.started = time.perf_counter()
        raw_metadata = context.invocation_metadata()
        traced = tracing.tracing_enabled()
        # The whole metadata as a dict only when a trace context is to be extracted.
        metadata = _metadata_dict(raw_metadata) if traced else {}
        request_id = metadata.get(REQUEST_ID_KEY, "") if traced else _request_id_of(raw_metadata)
        if not _REQUEST_ID_RE.match(request_id):
            request_id = new_request_id()
        structlog.contextvars.clear_contextvars()
        # One bind for all ids (sandbox_id is skipped when empty).
        bind_call(request_id=request_id, rpc=method, sandbox_id=sandbox_id)
        self.span_cm: Any = None
        if traced:
            self.span_cm = tracing.tracer().start_as_current_span(
                owner.full_names.get(method, method),
                context=tracing.extract_context(metadata),
                kind=trace.SpanKind.SERVER,
                attributes={
                    "rpc.system": "grpc",
                    "rpc.method": method,
                    "orchard.service": owner.service,
                    "orchard.request_id": request_id,
                },
            )
            self.span_cm.__enter__()
        self.first_exec = False


class ServerObservability(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Ids, span and metrics for every call a grpc.aio server handles."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.full_names: dict[str, str] = {}
        self._first_execs = _FirstExecs() if service == "executor" else None
        self._exec_phase = PHASE_SECONDS.labels("exec")
        self._first_exec_phase = PHASE_SECONDS.labels("first_exec")
        self._seconds: dict[str, Any] = {}
        self._wrapped: dict[str, tuple[Any, Any]] = {}
        self._requests: dict[tuple[str, str], Any] = {}

    def _note_sandbox(self, call: _Call, sandbox_id: str) -> None:
        """Span attribute and first-exec mark for the sandbox the request names (already bound to logs)."""
        if not sandbox_id:
            return
        if call.span_cm is not None:
            trace.get_current_span().set_attribute("orchard.sandbox_id", sandbox_id)
        if (
            self._first_execs is not None
            and call.method in EXEC_METHODS
            and self._first_execs.first(sandbox_id)
        ):
            call.first_exec = True

    def _done(self, call: _Call, context: Any, error: BaseException | None) -> None:
        elapsed = time.perf_counter() - call.started
        code = _status_name(context, error)
        counter = self._requests.get((call.method, code))
        if counter is None:
            counter = self._requests[(call.method, code)] = RPC_REQUESTS.labels(
                self.service, call.method, code
            )
        counter.inc()
        histogram = self._seconds.get(call.method)
        if histogram is None:
            histogram = self._seconds[call.method] = RPC_SECONDS.labels(self.service, call.method)
        histogram.observe(elapsed)
        if self._first_execs is not None and call.method in EXEC_METHODS:
            self._exec_phase.observe(elapsed)
            if call.first_exec:
                self._first_exec_phase.observe(elapsed)
        if call.span_cm is not None:
            span = trace.get_current_span()
            span.set_attribute("rpc.grpc.status_code", code)
            if code != "OK":
                span.set_status(trace.Status(trace.StatusCode.ERROR, code))
            call.span_cm.__exit__(None, None, None)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        # Wrapping once per method (not per call) keeps the per-call cost to the
        # bookkeeping itself; handlers are fixed objects per registered method.
        cached = self._wrapped.get(handler_call_details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        full = handler_call_details.method
        method = full.rsplit("/", 1)[-1]
        self.full_names.setdefault(method, full.lstrip("/"))
        wrapped = _wrap(self, handler, method)
        self._wrapped[full] = (handler, wrapped)
        return wrapped


def _status_name(context: Any, error: BaseException | None) -> str:
    code = None
    code_fn = getattr(context, "code", None)
    if callable(code_fn):
        try:
            code = code_fn()
        except Exception:  # older grpc: no code() on aio contexts
            code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):
        for status in grpc.StatusCode:
            if status.value[0] == code:
                return status.name
    if error is not None:
        return "UNKNOWN" if not isinstance(error, grpc.aio.AbortError) else "ABORTED"
    return "OK"


def _wrap(owner: ServerObservability, handler: Any, method: str) -> Any:
    if not handler.request_streaming and not handler.response_streaming:
        inner = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            sandbox_id = sandbox_id_of(request, owner.service)
            call = _Call(owner, method, context, sandbox_id)
            owner._note_sandbox(call, sandbox_id)
            error: BaseException | None = None
            try:
                return await inner(request, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                owner._done(call, context, error)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, handler.request_deserializer, handler.response_serializer
        )
    if not handler.request_streaming and handler.response_streaming:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            sandbox_id = sandbox_id_of(request, owner.service)
            call = _Call(owner, method, context, sandbox_id)
            owner._note_sandbox(call, sandbox_id)
            error: BaseException | None = None
            try:
                async for item in inner_us(request, context):
                    yield item
            except BaseException as exc:
                error = exc
                raise
            finally:
                owner._done(call, context, error)

        return grpc.unary_stream_rpc_method_handler(
            unary_stream, handler.request_deserializer, handler.response_serializer
        )
    if handler.request_streaming and not handler.response_streaming:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: Any) -> Any:
            call = _Call(owner, method, context)
            error: BaseException | None = None
            try:
                return await inner_su(requests, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                owner._done(call, context, error)

        return grpc.stream_unary_rpc_method_handler(
            stream_unary, handler.request_deserializer, handler.response_serializer
        )
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
        call = _Call(owner, method, context)
        error: BaseException | None = None
        try:
            async for item in inner_ss(requests, context):
                yield item
        except BaseException as exc:
            error = exc
            raise
        finally:
            owner._done(call, context, error)

    return grpc.stream_stream_rpc_method_handler(
        stream_stream, handler.request_deserializer, handler.response_serializer
    )


# ---- the client half ------------------------------------------------------------


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """``x-request-id`` of the current call and the trace context, for a call made on its behalf."""
    pairs = tracing.context_metadata()
    request_id = structlog.contextvars.get_contextvars().get("request_id")
    if isinstance(request_id, str) and request_id:
        pairs += ((REQUEST_ID_KEY, request_id),)
    return pairs


def _with_context(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    extra = outgoing_metadata()
    if not extra:
        return details
    metadata = grpc.aio.Metadata(*(tuple(details.metadata or ()) + extra))
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class OutgoingContextInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.aio.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds the request id and trace context to every outgoing grpc.aio call."""

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Any],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        return await continuation(_with_context(client_call_details), request)

    async def intercept_unary_stream(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Any],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        return await continuation(_with_context(client_call_details), request)
