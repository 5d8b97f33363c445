"""``NetworkPolicySpec``: a sandbox's network policy as plain, validated data.

Three modes:

- ``none``: loopback only. The sandbox's network namespace holds ``lo`` and
  nothing else, so there is no route at all (connect fails with ENETUNREACH).
- ``allowlist``: only the listed destinations. ``cidrs`` are reached directly
  (routed and NATed); ``domains`` through the egress proxy and the DNS
  forwarder, which resolve names themselves. ``ports``, when given, restrict
  both; empty means any port.
- ``internet``: any public destination (never private, loopback, link-local,
  multicast or the host's own addresses).

Whatever the mode, nothing of the node is reachable: ``guard.NodeGuard``
holds the node's addresses, the sandbox subnet and the control plane's
networks; ``check_reserved`` refuses a policy whose ``cidrs`` overlap them.

Domains: ``example.com`` matches that name only; ``*.example.com`` matches
every name below it (not the apex). IPv4 only: IPv6 is not routed to sandboxes.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass

MODE_NONE = "none"
MODE_ALLOWLIST = "allowlist"
MODE_INTERNET = "internet"
MODES = (MODE_NONE, MODE_ALLOWLIST, MODE_INTERNET)

MAX_CIDRS = 64
MAX_PORTS = 64
MAX_DOMAINS = 64

# Networks no policy may open: nothing useful is there, and some are dangerous
# (169.254.169.254 is the cloud metadata service on most clouds, 192.0.0.192
# Oracle Cloud's, 100.100.100.200 Alibaba Cloud's).
NEVER_ALLOWED = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "192.0.0.0/24",
        "100.100.100.200/32",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
)
# Private and shared address space: closed to ``internet`` and to names an
# ``allowlist`` resolves (DNS rebinding), open only when listed in ``cidrs``.
PRIVATE = tuple(
    ipaddress.IPv4Network(n)
    for n in ("10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16")
)

_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
DOMAIN_RE = re.compile(rf"^(\*\.)?({_LABEL}\.)*{_LABEL}$")


class PolicyError(ValueError):
    """A policy field is malformed; the message names the field."""


@dataclass(frozen=True)
class NetworkPolicySpec:
    mode: str = MODE_NONE
    cidrs: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    domains: tuple[str, ...] = ()

    @property
    def networked(self) -> bool:
        """Whether the sandbox needs an interface beyond loopback."""
        return self.mode != MODE_NONE

    @property
    def networks(self) -> tuple[ipaddress.IPv4Network, ...]:
        return tuple(ipaddress.IPv4Network(c) for c in self.cidrs)

    def allows_name(self, name: str) -> bool:
        """Whether ``name`` (lowercase, no trailing dot) matches the domain allowlist."""
        if self.mode == MODE_INTERNET:
            return True
        if self.mode != MODE_ALLOWLIST:
            return False
        for domain in self.domains:
            if domain.startswith("*."):
                if name.endswith(domain[1:]) and len(name) > len(domain) - 1:
                    return True
            elif name == domain:
                return True
        return False

    def allows_port(self, port: int) -> bool:
        return not self.ports or port in self.ports

    def allows_address(self, address: ipaddress.IPv4Address, *, listed_only: bool) -> bool:
        """Whether the proxy may connect to ``address``.

        ``listed_only``: the address came from an IP literal, so in
        ``allowlist`` mode it must be inside ``cidrs``; a name's addresses
        must only be public (or inside ``cidrs``).
        """
        if any(address in net for net in NEVER_ALLOWED):
            return False
        listed = any(address in net for net in self.networks)
        if self.mode == MODE_ALLOWLIST and (listed_only or listed):
            return listed
        if self.mode == MODE_NONE:
            return False
        return listed or not any(address in net for net in PRIVATE)

    def to_json(self) -> str:
        return json.dumps(
            {
                "mode": self.mode,
                "cidrs": list(self.cidrs),
                "ports": list(self.ports),
                "domains": list(self.domains),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> NetworkPolicySpec:
        data = json.loads(text)
        return build_policy(
            str(data.get("mode", MODE_NONE)),
            [str(c) for c in data.get("cidrs", [])],
            [int(p) for p in data.get("ports", [])],
            [str(d) for d in data.get("domains", [])],
        )


def build_policy(
    mode: str, cidrs: list[str], ports: list[int], domains: list[str]
) -> NetworkPolicySpec:
    """A checked, normalised policy, or :class:`PolicyError` naming the bad field."""
    if mode not in MODES:
        raise PolicyError(f"network.mode: {mode!r} is not one of {', '.join(MODES)}")
    if mode != MODE_ALLOWLIST:
        if cidrs or ports or domains:
            raise PolicyError(
                "network: cidrs, ports and domains are only allowed with mode ALLOWLIST"
            )
        return NetworkPolicySpec(mode=mode)
    if not cidrs and not domains:
        raise PolicyError("network: ALLOWLIST needs at least one cidr or domain")
    _check_count("cidrs", len(cidrs), MAX_CIDRS)
    _check_count("ports", len(ports), MAX_PORTS)
    _check_count("domains", len(domains), MAX_DOMAINS)
    return NetworkPolicySpec(
        mode=mode,
        cidrs=tuple(sorted({_cidr(c) for c in cidrs})),
        ports=tuple(sorted({_port(p) for p in ports})),
        domains=tuple(sorted({_domain(d) for d in domains})),
    )


def _check_count(name: str, count: int, limit: int) -> None:
    if count > limit:
        raise PolicyError(f"network.{name}: at most {limit} entries (got {count})")


def _cidr(value: str) -> str:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as err:
        raise PolicyError(
            f"network.cidrs: {value[:64]!r} is not an IPv4 network like 203.0.113.0/24 ({err})"
        ) from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise PolicyError(f"network.cidrs: {value[:64]!r}: only IPv4 is supported")
    for never in NEVER_ALLOWED:
        if net.overlaps(never):
            raise PolicyError(
                f"network.cidrs: {value!r} overlaps {never} (loopback, link-local, metadata, "
                "multicast or reserved), which no policy may open"
            )
    return str(net)


def check_reserved(
    policy: NetworkPolicySpec, reserved: list[tuple[ipaddress.IPv4Network, str]]
) -> None:
    """:class:`PolicyError` when a CIDR overlaps a reserved network (``what`` names it)."""
    for cidr, net in zip(policy.cidrs, policy.networks, strict=True):
        for network, what in reserved:
            if net.overlaps(network):
                raise PolicyError(
                    f"network.cidrs: {cidr!r} overlaps {what}, which no policy may open"
                )


def _port(value: int) -> int:
    if not 1 <= value <= 65535:
        raise PolicyError(f"network.ports: {value} is not a port (1-65535)")
    return value


def _domain(value: str) -> str:
    name = value.strip().lower().rstrip(".")
    if len(name) > 253 or not DOMAIN_RE.match(name):
        raise PolicyError(
            f"network.domains: {value[:80]!r} is not a domain name "
            "(e.g. example.com or *.example.com)"
        )
    if re.fullmatch(r"[0-9.]+", name.removeprefix("*.")):
        raise PolicyError(f"network.domains: {value!r} is an address; put it in cidrs")
    return name
