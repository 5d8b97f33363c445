"""Settings of the local (runc) backend: where its files live and which binaries it runs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from orchard.common.layout import NodeLayout, orchard_home

from ...tools import tools_dir_from_env
from ..netpolicy.settings import NetworkSettings
from . import userns as uid_ranges
from .model_endpoint import ModelEndpointSettings

DEFAULT_IMAGE = "debian:bookworm"
RUNTIME_RUNC = "runc"
"""Runtime class: a runc container served by the node executor."""
RUNTIME_INJECTED = "injected"
"""Runtime class: a runc container running its own executor from the bundle."""
RUNTIME_RUNSC = "runsc"
"""Runtime class: a gVisor (runsc) sandbox running its own executor from the bundle."""
LOCAL_RUNTIME_CLASSES = ("", RUNTIME_RUNC, RUNTIME_INJECTED, RUNTIME_RUNSC)


DEFAULT_SANDBOX_DISK_BYTES = 1 << 30


def sandbox_disk_bytes_from_env() -> int:
    """``ORCHARD_SANDBOX_DISK_BYTES`` (bytes; 0 = no tmpfs), else the default 1 GiB."""
    raw = os.environ.get("ORCHARD_SANDBOX_DISK_BYTES", "").strip()
    if not raw:
        return DEFAULT_SANDBOX_DISK_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"ORCHARD_SANDBOX_DISK_BYTES must be a byte count, not {raw!r}") from None
    if value < 0:
        raise ValueError("ORCHARD_SANDBOX_DISK_BYTES must be >= 0")
    return value


def scratch_mount_from_env() -> str:
    """``ORCHARD_SCRATCH_MOUNT``: how the per-sandbox tmpfs is mounted (``scratch.py``).

    "auto" (default): detached where the kernel can (Linux 6.13+), else mounted on
    the host; "detached": refuse to start without it; "mounted": the fallback even
    where the kernel could do better (how the tests prove the old-kernel path).
    Checked when the backend starts (``scratch.choose``).
    """
    return os.environ.get("ORCHARD_SCRATCH_MOUNT", "").strip() or "auto"


@dataclass(frozen=True)
class LocalSettings:
    home: Path
    """Node home (``layout.NodeLayout``): sandboxes/, run/ and by default images/."""
    images_dir: Path | None = None
    """Image store; None means ``<home>/images``."""
    runc: str = "runc"
    """The runc binary (a name on PATH or a path)."""
    runsc: str = "runsc"
    """gVisor's runsc binary, for sandboxes of runtime class "runsc" (``runsc.py``)."""
    default_image: str = DEFAULT_IMAGE
    """The image used when a create request names none."""
    init_binary: Path | None = None
    """orchard-init on the host (``python -m orchard.executor.initbin`` prints it); required to create."""
    parallelism: int = 0
    """How many runc/mount operations run at once; 0 means cores * 4."""
    network: NetworkSettings = field(default_factory=NetworkSettings.from_env)
    """Bridge, subnet and upstream DNS for sandboxes whose policy is not ``none``
    (``ORCHARD_NET_*`` variables, see ``netpolicy.settings``)."""
    executor_bundle: Path | None = None
    """The executor bundle; when set, sandboxes of runtime class "" run injected: the executor bundle (``python -m orchard.executor.bundle
    build`` prints it); each sandbox then runs its own executor from it, mounted
    read-only, reached at ``unix:<sandbox folder>/run/executor.sock``. None: the
    node executor serves every sandbox."""
    sandbox_disk_bytes: int = field(default_factory=sandbox_disk_bytes_from_env)
    """Each sandbox's folder (overlay upper/work, its files) is a tmpfs of this size: its
    disk quota, in memory and charged to its memory cgroup (``scratch.py``); 0 = the
    folder stays on the home's filesystem, uncapped ($ORCHARD_SANDBOX_DISK_BYTES)."""
    scratch_mount: str = field(default_factory=scratch_mount_from_env)
    """How that tmpfs is mounted: "auto", "detached" (6.13+) or "mounted" (the fallback
    for older kernels), see ``scratch.choose`` ($ORCHARD_SCRATCH_MOUNT)."""
    userns: bool = field(default_factory=uid_ranges.enabled_from_env)
    """Run runc and injected sandboxes in user namespaces, each on its own host uid range
    (``userns.py``). On by default; $ORCHARD_USERNS=0 turns them off (sandbox root is
    then host root), see docs/architecture.md."""
    userns_required: bool = field(default_factory=uid_ranges.required_from_env)
    """Every sandbox must run in a user namespace: the runtime class that cannot (runsc)
    is refused instead of running without one ($ORCHARD_USERNS=1)."""
    userns_uid_base: int = field(default_factory=uid_ranges.uid_base_from_env)
    """The first host uid of the first sandbox range ($ORCHARD_USERNS_UID_BASE)."""
    userns_ranges: int = field(default_factory=uid_ranges.ranges_from_env)
    """How many ranges of 65536 ids (sandboxes at once) ($ORCHARD_USERNS_RANGES)."""
    model_endpoint: ModelEndpointSettings = field(default_factory=ModelEndpointSettings.from_env)
    """Where sandboxes' model endpoints relay to, and their caps (``model_endpoint.py``;
    ``ORCHARD_MODEL_ENDPOINT_*``)."""
    executor_start_timeout: float = 30.0
    """Injected mode: how long a create waits for the sandbox's executor to serve."""
    tools_dir: Path | None = None
    """Where tools layers are built (``orchard.scheduler.tools``); None: $ORCHARD_TOOLS_DIR,
    else ``<home>/tools``."""

    @classmethod
    def from_env(cls) -> LocalSettings:
        images = os.environ.get("ORCHARD_IMAGES_DIR")
        init = os.environ.get("ORCHARD_INIT_BINARY")
        bundle = os.environ.get("ORCHARD_EXECUTOR_BUNDLE")
        return cls(
            home=orchard_home(),
            images_dir=Path(images) if images else None,
            init_binary=Path(init) if init else None,
            executor_bundle=Path(bundle) if bundle else None,
        )

    @property
    def layout(self) -> NodeLayout:
        return NodeLayout(self.home)

    @property
    def image_store_dir(self) -> Path:
        return self.images_dir if self.images_dir is not None else self.layout.images

    @property
    def tools_store_dir(self) -> Path:
        return self.tools_dir if self.tools_dir is not None else tools_dir_from_env(self.home)

    @property
    def runc_root(self) -> Path:
        """runc's state dir, apart from any other runc user on the machine."""
        return self.layout.run / "runc"

    @property
    def runsc_root(self) -> Path:
        """runsc's state dir (its own format, apart from runc's)."""
        return self.layout.run / "runsc"

    @property
    def max_parallel(self) -> int:
        return self.parallelism if self.parallelism > 0 else (os.cpu_count() or 1) * 4
