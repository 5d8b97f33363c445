"""The errors of a pull: one reason name per way it can fail, each message naming what failed."""

from __future__ import annotations

from ...base import BackendError

MANIFEST_UNKNOWN = "MANIFEST_UNKNOWN"
UNAUTHORIZED = "UNAUTHORIZED"
DIGEST_MISMATCH = "DIGEST_MISMATCH"
UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
PLATFORM_NOT_FOUND = "PLATFORM_NOT_FOUND"
REGISTRY_UNREACHABLE = "REGISTRY_UNREACHABLE"
REGISTRY_ERROR = "REGISTRY_ERROR"
INVALID_REFERENCE = "INVALID_REFERENCE"
INVALID_MANIFEST = "INVALID_MANIFEST"
INSUFFICIENT_STORAGE = "INSUFFICIENT_STORAGE"
STORAGE_ERROR = "STORAGE_ERROR"

_CLIENT_FAULTS = {
    MANIFEST_UNKNOWN,
    UNAUTHORIZED,
    UNSUPPORTED_MEDIA_TYPE,
    PLATFORM_NOT_FOUND,
    INVALID_REFERENCE,
    INVALID_MANIFEST,
}


class PullError(BackendError):
    """A pull that failed; ``reason`` is one of this module's names."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, message, client_fault=reason in _CLIENT_FAULTS)
