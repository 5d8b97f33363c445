"""Settings of the gateway."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GatewaySettings:
    home: Path
    """Where ``api_keys.json`` and the embedded default's ``dev-api-key`` live."""
    scheduler: str
    """The scheduler's internal address."""
    listen: str = "127.0.0.1:50051"
    """The public endpoint; port 0 picks a free one."""
    create_dev_key: bool = True
    """Make the ``dev`` tenant and its key file when there is no key file yet."""
    shutdown_grace_seconds: float = 5.0
