"""``orchard net set ID MODE [--cidr C] [--port P] [--domain D]``: change a running
sandbox's network policy (``none``, ``internet`` or ``allowlist``), and
``orchard net show ID``."""

from __future__ import annotations

import argparse
from typing import Any

from orchard.client import Sandbox, SandboxInfo

from ._connect import client


def register(commands: Any) -> None:
    net = commands.add_parser("net", help="show or change a sandbox's network policy")
    sub = net.add_subparsers(dest="net_command", required=True, metavar="ACTION")
    p = sub.add_parser("set", help="replace the policy of a running sandbox")
    p.add_argument("id", metavar="ID", help="the sandbox")
    p.add_argument(
        "mode", choices=["none", "allowlist", "internet"], help="the policy (docs/network.md)"
    )
    p.add_argument(
        "--cidr", action="append", default=[], help="allowlist: IPv4 network (repeatable)"
    )
    p.add_argument(
        "--port", action="append", default=[], type=int, help="allowlist: port (repeatable)"
    )
    p.add_argument(
        "--domain", action="append", default=[], help="allowlist: name or *.suffix (repeatable)"
    )
    p.set_defaults(run=cmd_set)
    p = sub.add_parser("show", help="print the policy in force")
    p.add_argument("id", metavar="ID", help="the sandbox")
    p.set_defaults(run=cmd_show)


def _sandbox(args: argparse.Namespace) -> Sandbox:
    return client(args).sandboxes.connect(args.id)


def _print(info: SandboxInfo) -> None:
    net = info.network
    print(f"mode: {net.mode}")
    for label, values in (("cidrs", net.cidrs), ("ports", net.ports), ("domains", net.domains)):
        if values:
            print(f"{label}: {' '.join(str(v) for v in values)}")


def cmd_set(args: argparse.Namespace) -> int:
    info = _sandbox(args).set_network(
        args.mode, cidrs=args.cidr, ports=args.port, domains=args.domain
    )
    _print(info)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    _print(_sandbox(args).info())
    return 0
