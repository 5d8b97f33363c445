"""Which in-process handler serves a full method path at an address.

Handlers are collected by calling the generated ``add_*Servicer_to_server``
functions with a :class:`HandlerCollector` in place of a ``grpc.Server``: the
fake is reached through exactly the method table, request deserializers and
response serializers a real server registers, so nothing about the wire
encoding is re-described by hand.
"""

from __future__ import annotations

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
        details = _CallDetails(method, ())
        for generic in site:
            found = generic.service(details)  # type: ignore[arg-type]
            if found is not None:
                return found
        return Status(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
