"""``NodeGuard``: what no sandbox reaches, whatever its policy and path.

The node's own addresses (every address of every interface, read with psutil,
which calls getifaddrs, and read again when older than a second, so an
address added while the proxy runs is guarded within a second), the sandbox
subnet (the bridge address and every other sandbox), the networks of the
control plane when it runs elsewhere (``deny_cidrs``), and ``NEVER_ALLOWED``
(loopback, link-local, metadata, multicast, reserved).

Two users: the egress proxy and DNS forwarder ask ``refusal(address)`` for
every address *after* resolution, just before connecting or answering; the
policy validation asks ``reserved()`` so a CIDR that overlaps any of it is
refused at create and at UpdateNetworkPolicy. The direct path needs neither:
nftables rejects every packet from the bridge to a local address (``input``)
and to the subnet, ``never`` and ``deny_cidrs`` (``forward``).
"""

from __future__ import annotations

import ipaddress
import socket
import time

import psutil  # type: ignore[import-untyped]

from .policy import NEVER_ALLOWED
from .settings import NetworkSettings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
REFRESH_SECONDS = 1.0


def interface_addresses() -> frozenset[Address]:
    """Every IPv4 and IPv6 address of every interface of this network namespace."""
    found: set[Address] = set()
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                found.add(ipaddress.ip_address(str(entry.address).split("%", 1)[0]))
    return frozenset(found)


class NodeGuard:
    def __init__(self, settings: NetworkSettings, *, subnet: bool = True) -> None:
        """``subnet``: guard the sandbox subnet (the local runtime; on Kubernetes
        the pod and service ranges are ``deny_cidrs``)."""
        self.subnet = settings.network if subnet else None
        self.deny = tuple(ipaddress.IPv4Network(c) for c in settings.deny_cidrs)
        self._node: frozenset[Address] = frozenset()
        self._read_at = float("-inf")

    def node_addresses(self) -> frozenset[Address]:
        now = time.monotonic()
        if now - self._read_at >= REFRESH_SECONDS:
            self._node = interface_addresses()
            self._read_at = now
        return self._node

    def refusal(self, address: ipaddress.IPv4Address) -> str | None:
        """Why no sandbox may reach ``address`` (None: the policy decides)."""
        if any(address in net for net in NEVER_ALLOWED):
            return "a loopback, link-local, metadata, multicast or reserved address"
        if self.subnet is not None and address in self.subnet:
            return f"in the sandbox subnet {self.subnet}"
        if address in self.node_addresses():
            return "an address of this node"
        for net in self.deny:
            if address in net:
                return f"in {net}, a control-plane network"
        return None

    def reserved(self) -> list[tuple[ipaddress.IPv4Network, str]]:
        """Every network a policy's cidrs may not overlap, with what it is."""
        found = [
            (n, f"{n} (loopback, link-local, metadata, multicast or reserved)")
            for n in NEVER_ALLOWED
        ]
        if self.subnet is not None:
            found.append((self.subnet, f"the sandbox subnet {self.subnet}"))
        for address in sorted(a for a in self.node_addresses() if a.version == 4):
            found.append((ipaddress.IPv4Network(address), f"an address of this node ({address})"))
        found += [(n, f"{n}, a control-plane network (ORCHARD_NET_DENY_CIDRS)") for n in self.deny]
        return found
