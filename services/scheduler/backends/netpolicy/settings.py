"""Settings of the local network: bridge, subnet, where leases live, upstream DNS."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

PROXY_PORT_IN_SANDBOX = 3128
DNS_PORT_IN_SANDBOX = 53


@dataclass(frozen=True)
class NetworkSettings:
    bridge: str = "orchard0"
    """Host bridge every networked sandbox's veth joins (shared by every backend on the host)."""
    subnet: str = "10.213.0.0/16"
    """Private IPv4 network of the sandboxes; the bridge takes its first address."""
    state_dir: Path = Path("/run/orchard/net")
    """Host-wide leases and lock (tmpfs: a reboot forgets them with the veths)."""
    dns_upstream: str = ""
    """``ip`` or ``ip:port`` of the resolver the proxy and DNS forwarder ask;
    empty means the first nameserver in the host's /etc/resolv.conf."""

    @classmethod
    def from_env(cls) -> NetworkSettings:
        env = os.environ
        return cls(
            bridge=env.get("ORCHARD_NET_BRIDGE") or cls.bridge,
            subnet=env.get("ORCHARD_NET_SUBNET") or cls.subnet,
            state_dir=Path(env.get("ORCHARD_NET_STATE_DIR") or cls.state_dir),
            dns_upstream=env.get("ORCHARD_NET_DNS_UPSTREAM") or "",
        )

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        """The bridge's address: sandboxes' default route, DNS server and proxy."""
        return self.network.network_address + 1

    def upstream(self) -> tuple[str, int]:
        """(ip, port) of the upstream resolver."""
        value = self.dns_upstream or _first_nameserver()
        host, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "53")
        return (host or value), int(port or 53)


def _first_nameserver() -> str:
    try:
        with open("/etc/resolv.conf", encoding="utf-8") as src:
            for line in src:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver" and ":" not in parts[1]:
                    return parts[1]
    except OSError:
        pass
    return "127.0.0.1"
