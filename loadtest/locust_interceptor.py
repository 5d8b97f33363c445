"""A gRPC client interceptor that reports every SDK call to Locust as a request event.

Locust's documented gRPC pattern: the interceptor times each call and fires
``environment.events.request`` with the call's name, response time (ms),
response length (serialized bytes) and exception, so Locust's statistics, CSV
and HTML report count it. It is given to the SDK's client as a public option:
``Orchard(interceptors=[LocustInterceptor(environment)])``.

The event's name is the *operation* the user is doing (``create``, ``exec
python3``, ...), set around the SDK call with :func:`operation`; a call made
outside any operation is named after its gRPC method. An operation may carry a
``check`` of the response (e.g. exit code 0 and the expected output): a failed
check is reported as the request's exception, so wrong answers count as
failures exactly like RPC errors.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from locust.env import Environment

from loadtest.locust_checks import Check


class WrongAnswer(Exception):
    """The call succeeded at the gRPC level but its answer failed the operation's check."""


@dataclass(frozen=True)
class Operation:
    name: str
    check: Check | None = None


_current: contextvars.ContextVar[Operation | None] = contextvars.ContextVar(
    "locust_operation", default=None
)


@contextlib.contextmanager
def operation(name: str, check: Check | None = None) -> Iterator[None]:
    """Name (and check) the gRPC calls made inside as one Locust request type."""
    token = _current.set(Operation(name, check))
    try:
        yield
    finally:
        _current.reset(token)


class LocustInterceptor(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Fires one Locust request event per unary call (every call the scenario makes is unary)."""

    def __init__(self, environment: Environment) -> None:
        self.environment = environment

    def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> Any:
        op = _current.get()
        name = op.name if op is not None else str(client_call_details.method).rsplit("/", 1)[-1]
        exception: BaseException | None = None
        length = 0
        started = time.perf_counter()
        outcome = continuation(client_call_details, request)
        try:
            response = outcome.result()
        except grpc.RpcError as err:
            exception = err
        else:
            length = response.ByteSize()
            if op is not None and op.check is not None:
                problem = op.check(response)
                if problem is not None:
                    exception = WrongAnswer(f"{name}: {problem}")
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        self.environment.events.request.fire(
            request_type="grpc",
            name=name,
            response_time=elapsed_ms,
            response_length=length,
            exception=exception,
            context={},
        )
        return outcome
