"""Settings of the local network: bridge, subnet, where leases live, upstream
DNS, what no sandbox may reach besides the node, and the egress proxy's and
DNS forwarder's per-sandbox limits (every one in this file, read from the
environment once at start; docs/network.md lists them with their defaults)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

PROXY_PORT_IN_SANDBOX = 3128
DNS_PORT_IN_SANDBOX = 53


@dataclass(frozen=True)
class EgressLimits:
    """What one sandbox, one tenant and the whole node may hold of the node's egress
    proxy and DNS forwarder.

    One proxy (in the scheduler on one machine) serves every sandbox of the
    node, so each budget is node-wide and split (``shares.Shares``): per
    sandbox, per tenant (below the node's, so one tenant's many sandboxes leave
    the rest to the others) and for the node (bounding the process's fds and
    tasks). Whoever reaches a cap is refused with a clear answer naming it (HTTP
    429, DNS REFUSED) while the others are served."""

    max_connections: int = 256
    """Proxy connections one sandbox may have open at once; the next one is
    answered ``429`` naming the cap (ORCHARD_NET_PROXY_MAX_CONNECTIONS)."""
    max_connections_per_tenant: int = 1024
    """Proxy connections all of one tenant's sandboxes may have open at once
    (ORCHARD_NET_PROXY_MAX_CONNECTIONS_PER_TENANT)."""
    max_connections_node: int = 4096
    """Proxy connections the node's proxy serves at once, every tenant together; each
    holds two fds (ORCHARD_NET_PROXY_MAX_CONNECTIONS_NODE)."""
    idle_seconds: float = 300.0
    """A tunnel or request that moves no byte either way for this long is
    closed, and so is a kept-alive connection with no next request
    (ORCHARD_NET_PROXY_IDLE_SECONDS)."""
    head_seconds: float = 10.0
    """Time a client has to send a whole request head (ORCHARD_NET_PROXY_HEAD_SECONDS)."""
    max_head_bytes: int = 16 * 1024
    """Longest request head; longer ones are answered 431."""
    hello_seconds: float = 10.0
    """Time a CONNECT tunnel has to send its whole TLS ClientHello, however
    fragmented (ORCHARD_NET_TLS_HELLO_SECONDS)."""
    max_hello_bytes: int = 64 * 1024
    """Largest ClientHello reassembled (every record of it); larger is refused."""
    connect_seconds: float = 10.0
    """Time to connect to the destination."""
    dns_max_pending: int = 64
    """DNS queries one sandbox may have waiting for the upstream; the next is
    answered REFUSED at once (ORCHARD_NET_DNS_MAX_PENDING)."""
    dns_max_pending_per_tenant: int = 128
    """DNS queries all of one tenant's sandboxes may have waiting; kept below
    ``dns_max_upstream`` so one tenant never holds every upstream socket
    (ORCHARD_NET_DNS_MAX_PENDING_PER_TENANT)."""
    dns_max_pending_node: int = 1024
    """DNS queries the node's forwarder has waiting at once, every tenant together
    (ORCHARD_NET_DNS_MAX_PENDING_NODE)."""
    dns_max_upstream: int = 256
    """Queries the node's proxy and forwarder may have at the upstream at
    once. Each has its own UDP socket (a random source port makes forged
    answers hard to land), so this bounds their sockets
    (ORCHARD_NET_DNS_MAX_UPSTREAM)."""
    dns_timeout_seconds: float = 2.0
    """How long an upstream query (waiting for a socket included) may take; past it
    the sandbox is answered SERVFAIL (the DNS idle timeout: no query waits longer)."""

    def __post_init__(self) -> None:
        for sandbox, tenant, node in (
            ("max_connections", "max_connections_per_tenant", "max_connections_node"),
            ("dns_max_pending", "dns_max_pending_per_tenant", "dns_max_pending_node"),
        ):
            values = [getattr(self, name) for name in (sandbox, tenant, node)]
            if values != sorted(values):
                raise ValueError(
                    f"egress limits: {sandbox} <= {tenant} <= {node} is needed"
                    f" (got {', '.join(map(str, values))}; {', '.join(_LIMIT_ENV[n] for n in (sandbox, tenant, node))})"
                )

    @classmethod
    def from_env(cls) -> EgressLimits:
        return cls(**positive_numbers_from_env(cls, _LIMIT_ENV))  # type: ignore[arg-type]


def positive_numbers_from_env(cls: type, names: dict[str, str]) -> dict[str, float]:
    """``{field: value}`` for each of ``names`` (field -> variable) set in the environment,
    an int or a float as the dataclass ``cls`` declares it; ValueError naming the variable
    for anything but a number above 0."""
    values: dict[str, float] = {}
    for name, key in names.items():
        text = os.environ.get(key, "").strip()
        if not text:
            continue
        kind = next(f.type for f in fields(cls) if f.name == name)
        try:
            value = int(text) if kind == "int" else float(text)
        except ValueError:
            raise ValueError(f"{key}={text!r} is not a number") from None
        if value <= 0:
            raise ValueError(f"{key}={text!r} must be above 0")
        values[name] = value
    return values


_LIMIT_ENV = {
    "max_connections": "ORCHARD_NET_PROXY_MAX_CONNECTIONS",
    "max_connections_per_tenant": "ORCHARD_NET_PROXY_MAX_CONNECTIONS_PER_TENANT",
    "max_connections_node": "ORCHARD_NET_PROXY_MAX_CONNECTIONS_NODE",
    "idle_seconds": "ORCHARD_NET_PROXY_IDLE_SECONDS",
    "head_seconds": "ORCHARD_NET_PROXY_HEAD_SECONDS",
    "hello_seconds": "ORCHARD_NET_TLS_HELLO_SECONDS",
    "dns_max_pending": "ORCHARD_NET_DNS_MAX_PENDING",
    "dns_max_pending_per_tenant": "ORCHARD_NET_DNS_MAX_PENDING_PER_TENANT",
    "dns_max_pending_node": "ORCHARD_NET_DNS_MAX_PENDING_NODE",
    "dns_max_upstream": "ORCHARD_NET_DNS_MAX_UPSTREAM",
}


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
    deny_cidrs: tuple[str, ...] = ()
    """Networks no sandbox may reach besides the node's own addresses (read
    from its interfaces): the control plane's, when it runs on other machines
    (ORCHARD_NET_DENY_CIDRS, comma-separated)."""
    limits: EgressLimits = field(default_factory=EgressLimits)

    @classmethod
    def from_env(cls) -> NetworkSettings:
        env = os.environ
        deny = tuple(
            c.strip() for c in env.get("ORCHARD_NET_DENY_CIDRS", "").split(",") if c.strip()
        )
        for cidr in deny:
            try:
                ipaddress.IPv4Network(cidr)
            except ValueError as err:
                raise ValueError(f"ORCHARD_NET_DENY_CIDRS: {cidr!r}: {err}") from None
        return cls(
            bridge=env.get("ORCHARD_NET_BRIDGE") or cls.bridge,
            subnet=env.get("ORCHARD_NET_SUBNET") or cls.subnet,
            state_dir=Path(env.get("ORCHARD_NET_STATE_DIR") or cls.state_dir),
            dns_upstream=env.get("ORCHARD_NET_DNS_UPSTREAM") or "",
            deny_cidrs=deny,
            limits=EgressLimits.from_env(),
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
