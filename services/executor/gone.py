"""A call that fails because its sandbox is being deleted reads as SANDBOX_NOT_FOUND.

A sandbox goes away in steps (the backend kills its init, detaches its network,
unmounts its root, then removes its folder and ``sandbox.json``), and a call that found
the sandbox just before can fail in the middle of that with whatever the missing piece
causes: ``user 'nobody' does not exist`` (the root's /etc/passwd is gone with the
overlay), a path not found, init's socket refusing. Those messages are true but
misleading; the caller should see what happened, ``SANDBOX_NOT_FOUND``, as it would a
moment later. So every RPC of the servicer runs under :func:`refine_failures`: on a
failure, if the sandbox the call named (:func:`remember`) is gone or going
(``SandboxLocator.is_gone``), the failure becomes SANDBOX_NOT_FOUND; otherwise it is
left as it was. The check costs nothing on success (it runs only on a failure).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from orchard.common.errors import ServiceError, not_found

from .sandboxes import Sandbox, SandboxLocator

_CALL_SANDBOX: contextvars.ContextVar[Sandbox | None] = contextvars.ContextVar(
    "orchard_executor_call_sandbox", default=None
)
NOT_FOUND_REASON = "SANDBOX_NOT_FOUND"

T = TypeVar("T")


def remember(sandbox: Sandbox) -> Sandbox:
    """Note the sandbox the current call works on (each gRPC call runs in its own task)."""
    _CALL_SANDBOX.set(sandbox)
    return sandbox


def refined(exc: Exception, locator: SandboxLocator) -> Exception:
    """``exc``, or SANDBOX_NOT_FOUND when the call's sandbox is gone or being deleted."""
    sandbox = _CALL_SANDBOX.get()
    if sandbox is None:
        return exc
    if isinstance(exc, ServiceError) and exc.reason == NOT_FOUND_REASON:
        return exc
    try:
        gone = locator.is_gone(sandbox)
    except OSError:
        return exc
    if not gone:
        return exc
    error = not_found(
        f"sandbox {sandbox.sandbox_id} does not exist on this node (deleted during the call)",
        NOT_FOUND_REASON,
    )
    error.__cause__ = exc
    return error


def refine_failures(locator_of: Callable[[Any], SandboxLocator]) -> Callable[[type[T]], type[T]]:
    """A class decorator: every public ``async`` method (unary or streaming) of the
    servicer refines its failures with :func:`refined` (``locator_of(self)``)."""

    def decorate(cls: type[T]) -> type[T]:
        for name in dir(cls):
            if name.startswith("_") or not name[0].isupper():
                continue  # gRPC method names are CamelCase
            method = getattr(cls, name)
            if inspect.isasyncgenfunction(method):
                setattr(cls, name, _wrap_stream(method, locator_of))
            elif inspect.iscoroutinefunction(method):
                setattr(cls, name, _wrap_unary(method, locator_of))
        return cls

    return decorate


def _wrap_unary(method: Any, locator_of: Callable[[Any], SandboxLocator]) -> Any:
    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except Exception as exc:
            better = refined(exc, locator_of(self))
            if better is exc:
                raise
            raise better from exc

    return unary


def _wrap_stream(method: Any, locator_of: Callable[[Any], SandboxLocator]) -> Any:
    @functools.wraps(method)
    async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            async for item in method(self, request, context):
                yield item
        except Exception as exc:
            better = refined(exc, locator_of(self))
            if better is exc:
                raise
            raise better from exc

    return stream
