"""``NetworkPolicy``: what a sandbox may reach, as the SDK's users write it.

``"none"`` (loopback only, the default), ``"internet"`` (any public address)
or an allowlist of networks, ports and domain names::

    NetworkPolicy.allowlist(domains=["pypi.org", "*.pythonhosted.org"], ports=[443])

Domains are reached through the node's egress proxy (``HTTPS_PROXY`` is set in
the sandbox); CIDRs directly. The server checks every field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchard._proto.orchard.v1 import common_pb2

from ._errors import InvalidRequestError

_MODES = {
    "none": common_pb2.NetworkPolicy.NONE,
    "allowlist": common_pb2.NetworkPolicy.ALLOWLIST,
    "internet": common_pb2.NetworkPolicy.INTERNET,
}


@dataclass(frozen=True)
class NetworkPolicy:
    """What a sandbox may reach: ``mode`` ``none``, ``internet`` or ``allowlist`` (of
    ``cidrs``, ``ports`` and ``domains``); see the module docstring."""

    mode: str = "none"
    cidrs: tuple[str, ...] = ()
    ports: tuple[int, ...] = ()
    domains: tuple[str, ...] = ()

    @classmethod
    def allowlist(
        cls,
        cidrs: Iterable[str] = (),
        ports: Iterable[int] = (),
        domains: Iterable[str] = (),
    ) -> NetworkPolicy:
        return cls("allowlist", tuple(cidrs), tuple(ports), tuple(domains))

    def to_proto(self) -> common_pb2.NetworkPolicy:
        mode = _MODES.get(self.mode.lower())
        if mode is None:
            raise InvalidRequestError(f"network: {self.mode!r} is not one of {', '.join(_MODES)}")
        return common_pb2.NetworkPolicy(
            mode=mode, cidrs=list(self.cidrs), ports=list(self.ports), domains=list(self.domains)
        )


def network_proto(network: str | NetworkPolicy | None) -> common_pb2.NetworkPolicy:
    """The proto for a mode name or a :class:`NetworkPolicy` (None: the server's default)."""
    if network is None:
        return common_pb2.NetworkPolicy()
    if isinstance(network, str):
        return NetworkPolicy(network).to_proto()
    return network.to_proto()


_NAMES = {value: name for name, value in _MODES.items()}


def network_from_proto(msg: common_pb2.NetworkPolicy) -> NetworkPolicy:
    return NetworkPolicy(
        _NAMES.get(msg.mode, "none"), tuple(msg.cidrs), tuple(msg.ports), tuple(msg.domains)
    )
