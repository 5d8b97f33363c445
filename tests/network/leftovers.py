"""What a sandbox's network leaves on the host: for "leaves nothing behind" checks."""

from __future__ import annotations

import os
from pathlib import Path

from orchard.scheduler.backends.netpolicy.addresses import nft_name, veth_name
from orchard.scheduler.backends.netpolicy.nftables import sandbox_objects
from orchard.scheduler.backends.netpolicy.settings import NetworkSettings


def network_leftovers(sandbox_id: str, settings: NetworkSettings | None = None) -> list[str]:
    """The sandbox's veth, nft chains/sets and address lease still on the host."""
    settings = settings or NetworkSettings.from_env()
    left = []
    if os.path.exists(f"/sys/class/net/{veth_name(sandbox_id)}"):
        left.append(f"veth {veth_name(sandbox_id)}")
    suffix = nft_name(sandbox_id)
    left += [f"nft {name}" for name in sandbox_objects() if name.endswith("_" + suffix)]
    leases = Path(settings.state_dir) / "leases"
    if leases.is_dir():
        for lease in leases.iterdir():
            if lease.read_text() == sandbox_id:
                left.append(f"lease {lease.name}")
    return left
