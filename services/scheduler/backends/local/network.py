"""``SandboxNetworking``: the local backend's side of network policy.

Glue between ``LocalBackend`` and ``netpolicy.local.LocalNetwork``: it knows
the sandbox folders (network.json, resolv.conf, sandbox.json's proxy env) and
keeps the egress proxy's table in step with the nft rules. Blocking work runs
in the backend's threads (``in_thread``); the proxy table is only touched on
the event loop.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from orchard.common.layout import NodeLayout, SandboxMeta

from ..base import BackendError
from ..netpolicy.links import LinkError
from ..netpolicy.local import NETWORK_FILE, Attachment, LocalNetwork, merge_proxy_env
from ..netpolicy.nftables import NftError
from ..netpolicy.policy import NetworkPolicySpec
from ..netpolicy.settings import NetworkSettings
from .oci_config import TENANT_GROUP_RE

T = TypeVar("T")
InThread = Callable[[Callable[[], T]], Awaitable[T]]


class SandboxNetworking:
    def __init__(self, settings: NetworkSettings, layout: NodeLayout) -> None:
        self.net = LocalNetwork(settings)
        self.layout = layout
        self._adopted = False
        # Addresses freed by a delete in a worker thread, for the loop to forget.
        self._released: dict[str, ipaddress.IPv4Address] = {}

    def resolv_conf_mount(self, sandbox_dir: Path) -> dict[str, Any]:
        """A read-only /etc/resolv.conf naming the DNS forwarder (every sandbox gets it,
        so a later policy change needs no mount)."""
        source = self.net.write_resolv_conf(sandbox_dir)
        return {
            "destination": "/etc/resolv.conf",
            "type": "bind",
            "source": str(source),
            "options": ["bind", "ro", "nosuid", "nodev", "noexec"],
        }

    async def apply(
        self,
        in_thread: InThread[Any],
        sandbox_id: str,
        init_pid: int,
        policy: NetworkPolicySpec,
    ) -> None:
        """Give a running sandbox ``policy``: interfaces, rules, proxy table, proxy env."""
        if policy.networked:
            await self.adopt(in_thread)
            await in_thread(self.net.ensure_infrastructure)
            await self.net.start_proxy()
        sandbox_dir = self.layout.sandbox(sandbox_id).dir

        def work() -> Attachment | None:
            try:
                attachment = self.net.apply(sandbox_id, sandbox_dir, init_pid, policy)
                _set_proxy_env(self.layout, sandbox_id, self.net.proxy_env(policy))
                return attachment
            except (LinkError, NftError, OSError) as err:
                raise BackendError.failure(f"network policy for {sandbox_id}: {err}") from err

        before = await in_thread(lambda: Attachment.read(sandbox_dir))
        attachment = await in_thread(work)
        proxy = self.net.proxy
        if proxy is None:
            return
        if attachment is not None and attachment.address is not None:
            tenant = await in_thread(functools.partial(tenant_key, self.layout, sandbox_id))
            proxy.set_policy(attachment.address, policy, tenant)
        elif before is not None and before.address is not None:
            proxy.forget(before.address)

    def detach_sync(self, sandbox_id: str) -> None:
        """Remove veth, rules and lease (blocking; part of delete)."""
        sandbox_dir = self.layout.sandbox(sandbox_id).dir
        try:
            address = self.net.detach(sandbox_id, sandbox_dir)
        except (LinkError, NftError, OSError) as err:
            raise BackendError.failure(f"network teardown for {sandbox_id}: {err}") from err
        if address is not None:
            self._released[sandbox_id] = address

    def forget_after_delete(self, sandbox_id: str) -> None:
        """Drop the deleted sandbox's proxy entry (on the loop, after ``detach_sync``)."""
        address = self._released.pop(sandbox_id, None)
        if address is not None and self.net.proxy is not None:
            self.net.proxy.forget(address)

    async def adopt(self, in_thread: InThread[Any]) -> None:
        """After a restart: point every networked sandbox's rules at this process's proxy."""
        if self._adopted:
            return
        self._adopted = True

        def found() -> list[tuple[str, Attachment]]:
            out = []
            with contextlib.suppress(FileNotFoundError), os.scandir(self.layout.sandboxes) as it:
                for entry in it:
                    attachment = Attachment.read(Path(entry.path))
                    if attachment is not None and attachment.address is not None:
                        out.append((entry.name, attachment))
            return out

        existing = await in_thread(found)
        if not existing:
            return
        await in_thread(self.net.ensure_infrastructure)
        await self.net.start_proxy()
        for sandbox_id, attachment in existing:
            meta_pid: int = await in_thread(functools.partial(_init_pid, self.layout, sandbox_id))
            if not meta_pid:
                continue
            with contextlib.suppress(BackendError):
                await self.apply(in_thread, sandbox_id, meta_pid, attachment.policy)

    async def close(self, in_thread: InThread[Any]) -> None:
        """Stop the proxy; remove bridge and tables if no sandbox on the host needs them."""
        await self.net.close()
        with contextlib.suppress(LinkError, NftError, OSError):
            await in_thread(self.net.remove_infrastructure_if_unused)


def _init_pid(layout: NodeLayout, sandbox_id: str) -> int:
    try:
        return SandboxMeta.from_json(layout.sandbox(sandbox_id).meta_file.read_text()).init_pid
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def tenant_key(layout: NodeLayout, sandbox_id: str) -> str:
    """The key the egress proxy's per-tenant caps count ``sandbox_id`` under: its tenant's
    cgroup group (``oci_config.tenant_group``, the folder above the sandbox's memory cgroup,
    shared by every sandbox of the tenant and kept in sandbox.json across restarts);
    "" when unknown (the proxy then counts the sandbox as its own tenant): an injected
    sandbox (its cgroup path is the one inside its container) and a claimed warm-pool
    member (it stays in the shared ``pool`` group, which is no one tenant's)."""
    try:
        meta = SandboxMeta.from_json(layout.sandbox(sandbox_id).meta_file.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    group = Path(meta.memory_cgroup).parent.name if meta.memory_cgroup else ""
    return group if TENANT_GROUP_RE.match(group) else ""


def _set_proxy_env(layout: NodeLayout, sandbox_id: str, proxy_env: dict[str, str]) -> None:
    """Rewrite sandbox.json's env with (or without) the proxy variables, if it changes."""
    meta_file = layout.sandbox(sandbox_id).meta_file
    try:
        meta = SandboxMeta.from_json(meta_file.read_text())
    except FileNotFoundError:
        return
    env = merge_proxy_env(meta.env, proxy_env)
    if env != meta.env:
        replace(meta, env=env).write(meta_file)


__all__ = ["NETWORK_FILE", "SandboxNetworking"]
