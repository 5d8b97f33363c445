"""The host bridge and the sandboxes' veth pairs, with iproute2.

A networked sandbox gets a veth pair: the host end (``ov<hash>``) joins the
bridge as an *isolated* port (isolated ports cannot talk to each other, only
to the bridge itself), the other end is created directly inside the sandbox's
network namespace (named by its init pid) as ``eth0`` with the leased address
and a default route via the bridge. A sandbox with policy ``none`` never gets
one: its namespace keeps only ``lo``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
from pathlib import Path

from .addresses import veth_name
from .settings import NetworkSettings

SANDBOX_IFACE = "eth0"
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


class LinkError(RuntimeError):
    pass


def _run(argv: list[str], script: str | None = None) -> None:
    proc = subprocess.run(argv, input=script, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LinkError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-1000:]}")


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def bridge_ports(bridge: str) -> list[str]:
    try:
        return sorted(os.listdir(f"/sys/class/net/{bridge}/brif"))
    except FileNotFoundError:
        return []


def ensure_bridge(settings: NetworkSettings) -> None:
    """Create and address the bridge, no IPv6 on it, forwarding on (saving the old value)."""
    br = settings.bridge
    if not link_exists(br):
        prefix = settings.network.prefixlen
        _run(
            ["ip", "-batch", "-"],
            f"link add {br} type bridge\n"
            f"addr add {settings.gateway}/{prefix} dev {br}\n"
            f"link set {br} up\n",
        )
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{br}/disable_ipv6").write_text("1")
    saved = settings.state_dir / "ip_forward.saved"
    if not saved.exists():
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(IP_FORWARD.read_text().strip())
    if IP_FORWARD.read_text().strip() != "1":
        IP_FORWARD.write_text("1")


def remove_bridge(settings: NetworkSettings) -> None:
    """Delete the bridge and put ip_forward back as it was before orchard."""
    if link_exists(settings.bridge):
        _run(["ip", "link", "del", settings.bridge])
    saved = settings.state_dir / "ip_forward.saved"
    with contextlib.suppress(FileNotFoundError):
        IP_FORWARD.write_text(saved.read_text().strip())
        saved.unlink()


def add_veth(
    sandbox_id: str, init_pid: int, address: ipaddress.IPv4Address, settings: NetworkSettings
) -> None:
    """The sandbox's veth pair, its address and default route."""
    host = veth_name(sandbox_id)
    if link_exists(host):
        _run(["ip", "link", "del", host])
    _run(
        ["ip", "-batch", "-"],
        f"link add {host} type veth peer name {SANDBOX_IFACE} netns {init_pid}\n"
        f"link set dev {host} master {settings.bridge}\n"
        f"link set dev {host} type bridge_slave isolated on learning off\n"
        f"link set dev {host} up\n",
    )
    try:
        _run(
            ["nsenter", f"--net=/proc/{init_pid}/ns/net", "ip", "-batch", "-"],
            f"addr add {address}/{settings.network.prefixlen} dev {SANDBOX_IFACE}\n"
            f"link set {SANDBOX_IFACE} up\n"
            f"route add default via {settings.gateway}\n",
        )
    except LinkError:
        remove_veth(sandbox_id)
        raise


def remove_veth(sandbox_id: str) -> None:
    """Delete the pair (deleting one end deletes both); nothing if it is gone."""
    host = veth_name(sandbox_id)
    if link_exists(host):
        with contextlib.suppress(LinkError):
            _run(["ip", "link", "del", host])
