"""Host-wide address leases for networked sandboxes, and their interface names.

Several backends (several ``orchard up`` homes, tests) may share the bridge,
so leases live in ``state_dir/leases/<address>`` (created with O_EXCL: the
file system is the lock) holding the sandbox id. The first candidate is a hash
of the sandbox id, then linear probing, so a lease is found in one try almost
always.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
from pathlib import Path

from .settings import NetworkSettings


def veth_name(sandbox_id: str) -> str:
    """The host end of the sandbox's veth: ``ov`` + 12 hex digits (IFNAMSIZ is 16)."""
    return "ov" + hashlib.sha256(sandbox_id.encode()).hexdigest()[:12]


def nft_name(sandbox_id: str) -> str:
    """The sandbox id as an nftables identifier (letters, digits, '_')."""
    return sandbox_id.replace("-", "_")


class AddressLeases:
    def __init__(self, settings: NetworkSettings) -> None:
        self.network = settings.network
        self.folder = settings.state_dir / "leases"

    def _path(self, address: ipaddress.IPv4Address) -> Path:
        return self.folder / str(address)

    def acquire(self, sandbox_id: str) -> ipaddress.IPv4Address:
        """A free address for ``sandbox_id`` (the one it already holds, if probing meets it)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        size = self.network.num_addresses
        # .0 is the network, .1 the bridge, the last the broadcast.
        usable = size - 3
        start = int.from_bytes(hashlib.sha256(sandbox_id.encode()).digest()[:4], "big") % usable
        for step in range(usable):
            address = self.network.network_address + 2 + (start + step) % usable
            try:
                fd = os.open(self._path(address), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                with contextlib.suppress(OSError):
                    if self._path(address).read_text() == sandbox_id:
                        return address  # already ours (a retried attach)
                continue
            with os.fdopen(fd, "w") as out:
                out.write(sandbox_id)
            return address
        raise OSError(f"no free address left in {self.network}")

    def held_by(self, sandbox_id: str) -> ipaddress.IPv4Address | None:
        try:
            with os.scandir(self.folder) as found:
                entries = list(found)
        except FileNotFoundError:
            return None
        for entry in entries:
            with contextlib.suppress(OSError):
                if Path(entry.path).read_text() == sandbox_id:
                    return ipaddress.IPv4Address(entry.name)
        return None

    def release(self, sandbox_id: str, address: ipaddress.IPv4Address | None = None) -> None:
        if address is None:
            address = self.held_by(sandbox_id)
        if address is None:
            return
        path = self._path(address)
        with contextlib.suppress(OSError):
            if path.read_text() == sandbox_id:
                path.unlink()

    def count(self) -> int:
        try:
            with os.scandir(self.folder) as found:
                return sum(1 for _ in found)
        except FileNotFoundError:
            return 0
