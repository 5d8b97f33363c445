"""Where the egress proxy may connect for a sandbox: the host a request names,
read strictly, checked against the policy, resolved by the proxy itself, and
every resolved address checked again (``NodeGuard`` and the policy) just
before the connection is made.

A host is a canonical dotted-quad IPv4 address or a DNS name; every other
spelling is refused (400), never guessed: ``2130706433``, ``0x7f.1``,
``0177.0.0.1``, ``127.1`` are addresses to URL parsers and C libraries
(WHATWG's "ends in a number" rule), so a name whose last label is a number is
not a name. IPv6 literals (IPv4-mapped, NAT64 and the rest) are refused:
sandboxes have IPv4 only.
"""

from __future__ import annotations

import ipaddress
import re

from .dns import Resolver
from .guard import NodeGuard
from .policy import DOMAIN_RE, NetworkPolicySpec

_NUMBER = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")


class Refused(Exception):
    """A request the proxy answers with ``status`` and ``why`` (then closes)."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


def parse_host(host: str) -> ipaddress.IPv4Address | str:
    """The IPv4 address or the (lowercase, dotless) name ``host`` means, or Refused."""
    if host.startswith("[") or ":" in host:
        raise Refused(403, f"{host[:100]} is an IPv6 address; sandboxes reach IPv4 only")
    try:
        return ipaddress.IPv4Address(host)
    except ValueError:
        pass
    name = host.lower().removesuffix(".")
    last = name.rsplit(".", 1)[-1]
    if _NUMBER.match(last):
        raise Refused(
            400, f"{host[:100]!r} is an IP address in a non-standard spelling; use a dotted quad"
        )
    if len(name) > 253 or not DOMAIN_RE.match(name) or name.startswith("*"):
        raise Refused(400, f"{host[:100]!r} is not a host name")
    return name


def split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    host, sep, port_text = authority.rpartition(":")
    if not sep or "]" in port_text:
        host, port_text = authority, ""
    if not port_text:
        if default_port is None:
            raise Refused(400, "CONNECT needs host:port")
        return authority, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536 or not host:
        raise Refused(400, f"bad authority {authority[:100]!r}")
    return host, int(port_text)


def same_authority(header: str, host: str, port: int) -> bool:
    try:
        h_host, h_port = split_authority(header, default_port=port)
    except Refused:
        return False
    return h_host.lower().rstrip(".") == host.lower().rstrip(".") and h_port == port


class Destinations:
    def __init__(self, guard: NodeGuard, resolver: Resolver) -> None:
        self.guard = guard
        self.resolver = resolver

    def allowed(self, policy: NetworkPolicySpec, address: ipaddress.IPv4Address) -> bool:
        """Whether a name's resolved ``address`` may be used (the DNS forwarder's test too)."""
        return self.guard.refusal(address) is None and policy.allows_address(
            address, listed_only=False
        )

    async def resolve(
        self, policy: NetworkPolicySpec, host: str, port: int
    ) -> ipaddress.IPv4Address:
        """The address to connect to for ``host:port``, or :class:`Refused`."""
        if not policy.allows_port(port):
            raise Refused(403, f"port {port} is not allowed for this sandbox")
        target = parse_host(host)
        if isinstance(target, ipaddress.IPv4Address):
            why = self.guard.refusal(target)
            if why is not None:
                raise Refused(403, f"{target} is {why}: no sandbox may reach it")
            if not policy.allows_address(target, listed_only=True):
                raise Refused(403, f"{target} is not allowed for this sandbox")
            return target
        if not policy.allows_name(target):
            raise Refused(403, f"{target} is not in this sandbox's allowlist")
        for address in await self.resolver.resolve(target):
            if self.allowed(policy, address):
                return address
        raise Refused(502, f"{target} has no address this sandbox may reach")
