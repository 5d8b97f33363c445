"""``LocalNetwork``: what the local backend calls to give a sandbox its policy.

Blocking methods (``attach``, ``detach``, ``ensure_infrastructure``) run in
the backend's worker threads; the proxy lives on the backend's event loop.
Per sandbox, ``<sandbox dir>/network.json`` records the policy and the leased
address *before* anything is configured, so a delete (or a scheduler
restarted after a crash) always knows what to undo. A sandbox with policy
``none`` costs nothing here: no lease, no veth, no rules, no file.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import links, nftables
from .addresses import AddressLeases, veth_name
from .dns import Resolver
from .guard import NodeGuard
from .policy import MODE_ALLOWLIST, NetworkPolicySpec
from .proxy import EgressProxy
from .settings import PROXY_PORT_IN_SANDBOX, NetworkSettings

NETWORK_FILE = "network.json"
RESOLV_CONF = "resolv.conf"
PROXY_ENV_KEYS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
NO_PROXY_KEYS = ("no_proxy", "NO_PROXY")


@dataclass(frozen=True)
class Attachment:
    """A networked sandbox's record: its policy and leased address."""

    policy: NetworkPolicySpec
    address: ipaddress.IPv4Address | None

    def to_json(self) -> str:
        return json.dumps(
            {
                "policy": json.loads(self.policy.to_json()),
                "address": None if self.address is None else str(self.address),
            }
        )

    @classmethod
    def read(cls, sandbox_dir: Path) -> Attachment | None:
        try:
            data = json.loads((sandbox_dir / NETWORK_FILE).read_text())
        except (OSError, ValueError):
            return None
        address = data.get("address")
        return cls(
            NetworkPolicySpec.from_json(json.dumps(data.get("policy", {}))),
            ipaddress.IPv4Address(address) if address else None,
        )

    def write(self, sandbox_dir: Path) -> None:
        tmp = sandbox_dir / (NETWORK_FILE + ".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, sandbox_dir / NETWORK_FILE)


class LocalNetwork:
    def __init__(self, settings: NetworkSettings) -> None:
        self.settings = settings
        self.leases = AddressLeases(settings)
        self.proxy: EgressProxy | None = None

    # -- host-wide infrastructure ---------------------------------------------

    @contextlib.contextmanager
    def host_lock(self) -> Iterator[None]:
        """Serialises bridge/table creation and removal across backends on the host."""
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.settings.state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def ensure_infrastructure(self) -> None:
        """The bridge, forwarding and both nft tables (idempotent)."""
        with self.host_lock():
            links.ensure_bridge(self.settings)
            if not nftables.table_exists():
                nftables.run_nft(nftables.base_script(self.settings))

    def remove_infrastructure_if_unused(self) -> bool:
        """Remove bridge, tables and forwarding once no sandbox on the host uses them."""
        with self.host_lock():
            if links.bridge_ports(self.settings.bridge) or self.leases.count():
                return False
            if nftables.table_exists():
                nftables.run_nft(nftables.delete_tables_script())
            links.remove_bridge(self.settings)
            return True

    async def start_proxy(self) -> EgressProxy:
        """This backend's proxy and DNS forwarder on the bridge address (once)."""
        if self.proxy is None:
            limits = self.settings.limits
            resolver = Resolver(
                self.settings.upstream(), limits.dns_timeout_seconds, limits.dns_max_upstream
            )
            proxy = EgressProxy(
                str(self.settings.gateway), resolver, NodeGuard(self.settings), limits
            )
            await proxy.start()
            self.proxy = proxy
        return self.proxy

    async def close(self) -> None:
        if self.proxy is not None:
            await self.proxy.close()
            self.proxy = None

    # -- per sandbox (blocking) -------------------------------------------------

    def write_resolv_conf(self, sandbox_dir: Path) -> Path:
        """The sandbox's /etc/resolv.conf (bind-mounted read-only): the forwarder on the bridge."""
        path = sandbox_dir / RESOLV_CONF
        path.write_text(f"nameserver {self.settings.gateway}\noptions timeout:2 attempts:2\n")
        return path

    def apply(
        self, sandbox_id: str, sandbox_dir: Path, init_pid: int, policy: NetworkPolicySpec
    ) -> Attachment | None:
        """Give the running sandbox ``policy`` (from whatever it had); None for ``none``."""
        current = Attachment.read(sandbox_dir)
        if not policy.networked:
            self.detach(sandbox_id, sandbox_dir)
            return None
        if self.proxy is None:
            raise RuntimeError("start_proxy() must run before a networked attach")
        self.ensure_infrastructure()
        address = current.address if current is not None else None
        if address is None:
            Attachment(policy, None).write(sandbox_dir)
            address = self.leases.acquire(sandbox_id)
        attachment = Attachment(policy, address)
        attachment.write(sandbox_dir)
        if (
            current is None
            or current.address is None
            or not links.link_exists(veth_name(sandbox_id))
        ):
            links.add_veth(sandbox_id, init_pid, address, self.settings)
        nftables.run_nft(
            nftables.apply_script(
                sandbox_id,
                address,
                policy,
                self.settings,
                self.proxy.proxy_port,
                self.proxy.dns_port,
            )
        )
        return attachment

    def detach(self, sandbox_id: str, sandbox_dir: Path) -> ipaddress.IPv4Address | None:
        """Undo everything ``apply`` did (idempotent); returns the address it held."""
        current = Attachment.read(sandbox_dir)
        links.remove_veth(sandbox_id)
        if current is None:
            return None
        address = current.address or self.leases.held_by(sandbox_id)
        if address is not None:
            if nftables.table_exists():
                nftables.run_nft(nftables.remove_script(sandbox_id, address))
            self.leases.release(sandbox_id, address)
        with contextlib.suppress(FileNotFoundError):
            (sandbox_dir / NETWORK_FILE).unlink()
        return address

    def proxy_env(self, policy: NetworkPolicySpec) -> dict[str, str]:
        """Environment that points HTTP clients at the proxy (allowlist only)."""
        if policy.mode != MODE_ALLOWLIST:
            return {}
        url = f"http://{self.settings.gateway}:{PROXY_PORT_IN_SANDBOX}"
        env = {key: url for key in PROXY_ENV_KEYS}
        env.update({key: "localhost,127.0.0.1" for key in NO_PROXY_KEYS})
        return env


def merge_proxy_env(env: dict[str, str], proxy_env: dict[str, str]) -> dict[str, str]:
    """``env`` with the proxy variables replaced by ``proxy_env``'s (removed when empty)."""
    merged = {k: v for k, v in env.items() if k not in (*PROXY_ENV_KEYS, *NO_PROXY_KEYS)}
    merged.update(proxy_env)
    return merged
