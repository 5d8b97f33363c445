"""Refusals of the fake servicers, carried as the real services carry theirs.

A fake servicer raises :class:`Refusal`; :mod:`_rpc` turns it into a status
with the same ``orchard-reason`` / ``orchard-fault`` trailing metadata the
real services send (``src/orchard/common/errors.py`` on the server side), so
the SDK's own error mapping sees exactly what it would see from a real stack.
The key names come from the SDK (the fake must not import a service or the
servers' shared module); a test pins them to the servers' names.
"""

from __future__ import annotations

from typing import Literal

import grpc

from orchard.client._errors import FAULT_KEY, REASON_KEY

Fault = Literal["client", "task", "infrastructure"]

Trailers = tuple[tuple[str, str], ...]


class Refusal(Exception):
    """A call the fake refuses: gRPC code, ``ErrorReason`` name, message, fault."""

    def __init__(
        self, code: grpc.StatusCode, reason: str, message: str, fault: Fault = "client"
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.fault: Fault = fault

    def trailers(self) -> Trailers:
        return ((REASON_KEY, self.reason), (FAULT_KEY, self.fault))


def invalid(message: str, reason: str = "INVALID_FIELD") -> Refusal:
    return Refusal(grpc.StatusCode.INVALID_ARGUMENT, reason, message)


def not_found(message: str, reason: str) -> Refusal:
    return Refusal(grpc.StatusCode.NOT_FOUND, reason, message)


def precondition(message: str, reason: str) -> Refusal:
    return Refusal(grpc.StatusCode.FAILED_PRECONDITION, reason, message)


def unauthenticated(message: str, reason: str) -> Refusal:
    return Refusal(grpc.StatusCode.UNAUTHENTICATED, reason, message)


def escape(message: str) -> Refusal:
    return invalid(message, "PATH_ESCAPE")
