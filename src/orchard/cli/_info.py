"""``orchard info ID [--json]``: everything the control plane says about one sandbox.

What ``GetSandbox`` returns, as the SDK's :class:`SandboxInfo` holds it: state
(and why, and whose fault a failure is), image, template, resources, network
policy, labels, environment, times, lease length, and which node executor
serves its data plane. The data-plane token is not printed: it is a credential
the SDK fetches and refreshes by itself; its expiry is shown.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from orchard.client import SandboxInfo

from ._connect import client
from ._json import add_flag, line


def register(commands: Any) -> None:
    p = commands.add_parser("info", help="everything the control plane says about a sandbox")
    p.add_argument("id", metavar="ID", help="the sandbox")
    add_flag(p)
    p.set_defaults(run=cmd_info)


def _when(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).isoformat() if value else "-"


def _pairs(values: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(values.items())) or "-"


def rows(info: SandboxInfo) -> list[tuple[str, str]]:
    net = info.network
    policy = " ".join(
        [net.mode]
        + [f"cidr={c}" for c in net.cidrs]
        + [f"port={p}" for p in net.ports]
        + [f"domain={d}" for d in net.domains]
    )
    return [
        ("id", info.id),
        ("state", info.state),
        ("state_reason", info.state_reason or "-"),
        ("fault", info.fault or "-"),
        ("tenant", info.tenant or "-"),
        ("image", info.image or "(default)"),
        ("template", info.template or "-"),
        ("cpu", f"{info.cpu:g}"),
        ("memory", f"{info.memory_bytes} ({info.memory_bytes / (1 << 20):.0f}Mi)"),
        ("pids", str(info.pids) if info.pids else "-"),
        ("network", policy),
        ("labels", _pairs(info.labels)),
        ("env", _pairs(info.env)),
        ("created_at", _when(info.created_at)),
        ("expires_at", _when(info.expires_at)),
        ("ttl_seconds", str(info.ttl_seconds) if info.ttl_seconds else "-"),
        ("executor", info.executor_address or "-"),
        ("executor_tls", "yes" if info.executor_tls else "no"),
        ("token_expires_at", _when(info.token_expires_at)),
    ]


def cmd_info(args: argparse.Namespace) -> int:
    info = client(args).sandboxes.connect(args.id).last_info
    if args.json:
        print(line(info))
        return 0
    width = max(len(k) for k, _ in rows(info))
    for key, value in rows(info):
        print(f"{key + ':':<{width + 1}} {value}")
    return 0
