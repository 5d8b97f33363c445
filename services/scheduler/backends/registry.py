"""Choosing a backend by name: the scheduler's settings -> that backend's own settings -> the backend.

Apart from the contract (``base``) so that the interface module imports no
backend, and so that ``local`` and ``kubernetes`` never import each other (an
import-linter contract checks it): this module is the one place that knows
both. Each backend is imported only when chosen, so a local node does not load
the Kubernetes client and a cluster scheduler does not load runc's helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .base import Backend, BackendError, check_capabilities

if TYPE_CHECKING:
    from .base import (
        Closing,
        EnvUpdating,
        FailureReporting,
        ModelEndpointing,
        NetworkUpdating,
        PoolState,
        RuntimeClassChecking,
    )
    from .kubernetes.backend import KubernetesBackend
    from .local.backend import LocalBackend

    def _declarations_match_signatures(local: LocalBackend, kube: KubernetesBackend) -> None:
        """For mypy only: each backend satisfies the Protocol of every capability it
        declares (``supports`` casts; this is what makes the cast honest)."""
        _local: tuple[
            Backend,
            EnvUpdating,
            NetworkUpdating,
            FailureReporting,
            RuntimeClassChecking,
            ModelEndpointing,
            Closing,
        ] = (local, local, local, local, local, local, local)
        _kube: tuple[Backend, PoolState, NetworkUpdating, FailureReporting, Closing] = (
            kube, kube, kube, kube, kube,
        )  # fmt: skip


class NodeSettings(Protocol):
    """What the registry reads of the scheduler's settings (``SchedulerSettings`` has it)."""

    @property
    def home(self) -> Path: ...
    @property
    def images_dir(self) -> Path | None: ...
    @property
    def init_binary(self) -> Path | None: ...
    @property
    def executor_bundle(self) -> Path | None: ...


def _local(node: NodeSettings) -> Backend:
    from .local.backend import LocalBackend
    from .local.settings import LocalSettings

    return LocalBackend(
        LocalSettings(
            home=node.home,
            images_dir=node.images_dir,
            init_binary=node.init_binary,
            executor_bundle=node.executor_bundle,
        )
    )


def _kubernetes(node: NodeSettings) -> Backend:
    from .kubernetes.backend import KubernetesBackend
    from .kubernetes.pod_settings import PodSettingsError
    from .kubernetes.settings import KubernetesSettings

    try:
        settings = KubernetesSettings.from_env(node.home)
    except PodSettingsError as err:
        raise BackendError.invalid(f"kubernetes backend: {err}") from err
    from orchard.common.layout import NodeLayout

    return KubernetesBackend(settings, keyring=NodeLayout(node.home).keyring_file())


BACKENDS: dict[str, Callable[[NodeSettings], Backend]] = {
    "local": _local,
    "kubernetes": _kubernetes,
}
"""Backend name -> how to build it from the scheduler's settings."""


def load_backend(name: str, node: NodeSettings) -> Backend:
    """The backend called ``name``, built from its own settings (derived from ``node``)."""
    build = BACKENDS.get(name)
    if build is None:
        raise BackendError.invalid(
            f"unknown backend {name!r} (known: {', '.join(sorted(BACKENDS))})",
            reason="UNSUPPORTED",
        )
    backend = build(node)
    check_capabilities(backend)
    return backend
