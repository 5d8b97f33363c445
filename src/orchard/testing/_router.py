"""Which in-process handler serves a full method path at an address.

Handlers are collected by calling the generated ``add_*Servicer_to_server``
functions with a :class:`HandlerCollector` in place of a ``grpc.Server``: the
fake is reached through exactly the method table, request deserializers and
response serializers a real server registers, so nothing about the wire
encoding is re-described by hand.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import grpc

from ._rpc import Status
from ._status import Trailers


class _CallDetails(NamedTuple):
    method: str
    invocation_metadata: Trailers


class HandlerCollector:
    """Stands in for ``grpc.Server`` while generated code registers a servicer."""

    def __init__(self) -> None:
        self.generic: list[grpc.GenericRpcHandler[Any, Any]] = []

    def add_generic_rpc_handlers(
        self, handlers: Iterable[grpc.GenericRpcHandler[Any, Any]]
    ) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        """Newer generated code registers twice; the generic handlers already cover it."""


class Router:
    """Full method path -> handler, per address the fake answers on."""

    def __init__(self) -> None:
        self._sites: dict[str, list[grpc.GenericRpcHandler[Any, Any]]] = {}
        self._lock = threading.Lock()
        # method name ("Run") or full path -> [status, calls left (None: always)]
        self._failures: dict[str, list[Any]] = {}

    def fail(self, method: str, status: Status, times: int | None) -> None:
        """Answer calls of ``method`` with ``status`` (``times`` calls, or always)."""
        with self._lock:
            self._failures[method] = [status, times]

    def _injected(self, method: str) -> Status | None:
        with self._lock:
            for key in (method, method.rsplit("/", 1)[-1]):
                entry = self._failures.get(key)
                if entry is None:
                    continue
                status, left = entry
                if left is not None:
                    if left <= 1:
                        del self._failures[key]
                    else:
                        entry[1] = left - 1
                return status  # type: ignore[no-any-return]
        return None

    def serve(self, address: str, *adders: tuple[Callable[[Any, Any], None], Any]) -> None:
        """Register ``(add_XServicer_to_server, servicer)`` pairs at ``address``."""
        collector = HandlerCollector()
        for add, servicer in adders:
            add(servicer, collector)
        self._sites.setdefault(address, []).extend(collector.generic)

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(self._sites)

    def handler(self, address: str, method: str) -> grpc.RpcMethodHandler[Any, Any] | Status:
        """The handler, or the status a real client would get (UNAVAILABLE, UNIMPLEMENTED)."""
        site = self._sites.get(address)
        if site is None:
            known = ", ".join(self._sites)
            return Status(
                grpc.StatusCode.UNAVAILABLE,
                f"failed to connect to all addresses: the fake serves {known}, not {address!r} "
                "(make the client with fake.client(), or pass endpoint=fake.endpoint and "
                "api_key=fake.api_key)",
            )
        injected = self._injected(method)
        if injected is not None:
            return injected
        details = _CallDetails(method, ())
        for generic in site:
            found = generic.service(details)  # type: ignore[arg-type]
            if found is not None:
                return found
        return Status(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")


class ChannelFactories:
    """The four multi-callable factories of a channel, shared by the sync and aio channels;
    ``kinds`` names the multi-callable class each one returns. ``_registered_method``
    (grpcio's registered-method optimisation; ``grpc.intercept_channel`` passes it by
    position) means nothing in process."""

    kinds: dict[str, Callable[..., Any]]

    def _make(self, kind: str, method: str, serialize: Any, deserialize: Any) -> Any:
        return self.kinds[kind](self, method, serialize, deserialize)

    def unary_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: Any = False,
    ) -> Any:
        return self._make("unary_unary", method, request_serializer, response_deserializer)

    def unary_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: Any = False,
    ) -> Any:
        return self._make("unary_stream", method, request_serializer, response_deserializer)

    def stream_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: Any = False,
    ) -> Any:
        return self._make("stream_unary", method, request_serializer, response_deserializer)

    def stream_stream(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: Any = False,
    ) -> Any:
        return self._make("stream_stream", method, request_serializer, response_deserializer)
