"""What an Inspect task or sample says about its Orchard sandbox.

``sandbox=("orchard", OrchardSandboxConfig(image="py", cpu=1))`` per task or per
sample, or ``("orchard", "orchard.yaml")``: a YAML or JSON file with the same
fields. Unknown fields are refused (a typo would otherwise be a silent default).
Credentials are never part of it (configs are written into eval logs): the
client reads ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY`` / ``ORCHARD_HOME`` as
the SDK always does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

import orchard


class OrchardAllowlist(BaseModel, frozen=True):
    """An ``allowlist`` network policy: networks, ports and domain names."""

    model_config = ConfigDict(extra="forbid")

    cidrs: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    domains: tuple[str, ...] = ()


class OrchardSandboxConfig(BaseModel, frozen=True):
    """One sample's sandbox: image, resources, network and where relative paths live."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = None
    """Image name (``orchard image ls``); None: the server's default image."""
    template: str | None = None
    """Claim a warm sandbox of this template instead (image/resources come from it)."""
    cpu: float | str | None = None
    """Cores (``1``, ``0.5``, ``"500m"``); None: the server's default."""
    memory: int | str | None = None
    """Bytes or a size (``"1Gi"``); None: the server's default."""
    pids: int | None = None
    network: Literal["none", "internet"] | OrchardAllowlist = "none"
    """``"none"`` (loopback only), ``"internet"``, or an allowlist."""
    ttl: float = Field(default=3 * 3600, gt=0)
    """Seconds until the server reaps the sandbox if the eval never cleans it up."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of every command."""
    labels: dict[str, str] = Field(default_factory=dict)
    working_dir: str = "/work"
    """The per-sample directory relative paths and commands start in (made at init)."""
    wait_for_quota: float = Field(default=600, ge=0)
    """Seconds a create waits politely when the tenant is over quota before failing."""

    def network_policy(self) -> str | orchard.NetworkPolicy:
        if isinstance(self.network, OrchardAllowlist):
            n = self.network
            return orchard.NetworkPolicy.allowlist(n.cidrs, n.ports, n.domains)
        return self.network


def resolve_config(config: object) -> OrchardSandboxConfig:
    """The config Inspect handed over: ours, a file name, or None (all defaults)."""
    if config is None:
        return OrchardSandboxConfig()
    if isinstance(config, OrchardSandboxConfig):
        return config
    if isinstance(config, str):
        path = Path(config)
        if not path.is_file():
            raise ValueError(f"orchard sandbox config: no such file {config!r}")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"orchard sandbox config {config!r}: expected a mapping")
        return OrchardSandboxConfig.model_validate(data)
    if isinstance(config, BaseModel):
        return OrchardSandboxConfig.model_validate(config.model_dump())
    raise TypeError(f"orchard sandbox config: unsupported {type(config).__name__}")
