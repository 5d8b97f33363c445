"""Errors that cross a service boundary, and how they travel as gRPC statuses.

Server code raises :class:`ServiceError` (or one of the helpers below); the
gRPC layer turns it into a status with a clear message plus two trailing
metadata entries: ``orchard-reason`` (an ``ErrorReason`` name from
common.proto) and ``orchard-fault`` (``client``, ``task`` or
``infrastructure``). The SDK maps those back onto its exception tree.
"""

from __future__ import annotations

from typing import Literal

import grpc

Fault = Literal["client", "task", "infrastructure"]

REASON_KEY = "orchard-reason"
FAULT_KEY = "orchard-fault"
# Seconds after which a RESOURCE_EXHAUSTED call may succeed (the SDK reads it
# into QuotaExceededError.retry_after and backs off by it when asked to).
RETRY_AFTER_KEY = "retry-after"


class ServiceError(Exception):
    """A failure to report to the caller as a gRPC status."""

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: str,
        message: str,
        fault: Fault = "client",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.fault: Fault = fault
        self.retry_after = retry_after

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        pairs: tuple[tuple[str, str], ...] = ((REASON_KEY, self.reason), (FAULT_KEY, self.fault))
        if self.retry_after is not None:
            pairs += ((RETRY_AFTER_KEY, f"{self.retry_after:.3f}"),)
        return pairs


def invalid(message: str, reason: str = "INVALID_FIELD") -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, reason, message)


def not_found(message: str, reason: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, reason, message)


def precondition(message: str, reason: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, reason, message)


def unauthenticated(message: str, reason: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAUTHENTICATED, reason, message)


def infrastructure(message: str, reason: str = "BACKEND_FAILURE") -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAVAILABLE, reason, message, fault="infrastructure")


def quota_exceeded(message: str, retry_after: float) -> ServiceError:
    """RESOURCE_EXHAUSTED / QUOTA_EXCEEDED with a ``retry-after`` hint (seconds)."""
    return ServiceError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "QUOTA_EXCEEDED",
        message,
        retry_after=max(0.0, retry_after),
    )
