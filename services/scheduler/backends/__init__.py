"""Sandbox backends behind one small interface (see ``base``); ``local`` runs real runc containers."""

from .base import (
    Backend,
    BackendError,
    BackendSandbox,
    ImageInfo,
    SandboxSpec,
    load_backend,
)

__all__ = [
    "Backend",
    "BackendError",
    "BackendSandbox",
    "ImageInfo",
    "SandboxSpec",
    "load_backend",
]
