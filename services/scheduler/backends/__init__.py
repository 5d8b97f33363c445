"""Sandbox backends behind one contract (``base``), chosen by name in ``registry``.

``local`` runs real runc containers on this machine; ``kubernetes`` runs pods.
The two never import each other (import-linter checks it).
"""

from .base import (
    Backend,
    BackendError,
    BackendSandbox,
    ImageInfo,
    SandboxSpec,
)

__all__ = [
    "Backend",
    "BackendError",
    "BackendSandbox",
    "ImageInfo",
    "SandboxSpec",
]
