"""The egress proxy as its own process, for Kubernetes: ``python -m
orchard.scheduler.backends.netpolicy.proxy_server --table-dir DIR``.

The same proxy and DNS forwarder as the local runtime (``proxy.EgressProxy``),
on fixed ports behind the chart's Service. Sandboxes are told apart by their
pod IP; the table of pod IP -> policy is the ConfigMap the Kubernetes backend
keeps (``netpolicy.k8s``), mounted as a folder of ``<sandbox id>.json`` files.
The kubelet refreshes a mounted ConfigMap on its own schedule (about a minute
by default), so this process re-reads the folder every ``--poll-seconds`` and
applies the difference: new and changed entries replace the policy (open
tunnels under an old policy are cut), removed ones are forgotten.

Prints ``proxy <port> dns <port>`` once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import signal
from pathlib import Path

import structlog

from .dns import Resolver
from .guard import NodeGuard
from .k8s import read_proxy_entries
from .policy import NetworkPolicySpec
from .proxy import EgressProxy
from .settings import NetworkSettings

log = structlog.get_logger("orchard.netpolicy.proxy_server")

MAX_TABLE_FILE_BYTES = 64 * 1024


def read_table_dir(folder: Path) -> dict[ipaddress.IPv4Address, tuple[NetworkPolicySpec, str]]:
    """The table in ``folder`` (a mounted ConfigMap); unreadable or huge files are skipped."""
    files: dict[str, str] = {}
    with contextlib.suppress(FileNotFoundError):
        for path in folder.iterdir():
            # A ConfigMap mount also holds ``..data`` and timestamped folders: skip them.
            if path.name.startswith(".") or not path.name.endswith(".json"):
                continue
            with contextlib.suppress(OSError, UnicodeDecodeError):
                if path.stat().st_size <= MAX_TABLE_FILE_BYTES:
                    files[path.name] = path.read_text()
    return read_proxy_entries(files)


class TableSync:
    """Keeps the proxy's clients equal to the table folder."""

    def __init__(self, proxy: EgressProxy, folder: Path) -> None:
        self.proxy = proxy
        self.folder = folder
        self.current: dict[ipaddress.IPv4Address, tuple[NetworkPolicySpec, str]] = {}

    def sync_once(self) -> int:
        """Apply the folder's table; returns how many entries changed."""
        wanted = read_table_dir(self.folder)
        changed = 0
        for address in set(self.current) - set(wanted):
            self.proxy.forget(address)
            changed += 1
        for address, (policy, tenant) in wanted.items():
            if self.current.get(address) != (policy, tenant):
                self.proxy.set_policy(address, policy, tenant)
                changed += 1
        self.current = wanted
        if changed:
            log.info("egress table applied", sandboxes=len(wanted), changed=changed)
        return changed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m orchard.scheduler.backends.netpolicy.proxy_server", description=__doc__
    )
    parser.add_argument("--table-dir", type=Path, required=True, help="the mounted ConfigMap")
    parser.add_argument("--bind", default="0.0.0.0", help="address to serve on")
    parser.add_argument("--port", type=int, default=3128, help="HTTP proxy port")
    parser.add_argument("--dns-port", type=int, default=5353, help="DNS forwarder port (UDP)")
    parser.add_argument(
        "--upstream", default="", help="upstream DNS ip[:port] (default: /etc/resolv.conf)"
    )
    parser.add_argument("--poll-seconds", type=float, default=2.0)
    parser.add_argument(
        "--deny",
        action="append",
        default=[],
        metavar="CIDR",
        help="a network no sandbox may reach through the proxy (the cluster's pod and service "
        "ranges, the control plane); repeat for more. The proxy's own addresses are always denied.",
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    env = NetworkSettings.from_env()
    settings = NetworkSettings(
        dns_upstream=args.upstream,
        deny_cidrs=(*env.deny_cidrs, *args.deny),
        limits=env.limits,
    )
    limits = settings.limits
    resolver = Resolver(settings.upstream(), limits.dns_timeout_seconds, limits.dns_max_upstream)
    # No sandbox subnet here: pods are told apart by IP, their ranges come in --deny.
    guard = NodeGuard(settings, subnet=False)
    proxy = EgressProxy(args.bind, resolver, guard, limits, args.port, args.dns_port)
    await proxy.start()
    sync = TableSync(proxy, args.table_dir)
    sync.sync_once()
    print(f"proxy {proxy.proxy_port} dns {proxy.dns_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), args.poll_seconds)
        try:
            sync.sync_once()
        except Exception:
            log.exception("reading the egress table failed")
    await proxy.close()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
