"""``orchard pool ls | hint``: the scheduler's warm pools through the SDK.

orchard pool ls [--json]                 templates, sizes, targets, hit rates
orchard pool hint TEMPLATE N [--within S]  N claims of TEMPLATE coming within S seconds
"""

from __future__ import annotations

import argparse
from typing import Any

from orchard.client import PoolInfo

from ._connect import client
from ._json import add_flag, print_lines
from ._sandboxes import print_table


def register(commands: Any) -> None:
    pool = commands.add_parser("pool", help="warm pools of sandbox templates")
    sub = pool.add_subparsers(dest="pool_command", required=True, metavar="SUBCOMMAND")

    p = sub.add_parser("ls", help="list pools: ready/claimed/min/max/target and hit rate")
    add_flag(p)
    p.set_defaults(run=cmd_pool_ls)

    p = sub.add_parser("hint", help="tell the scheduler a batch of claims is coming")
    p.add_argument("template", help="the template's name (templates.toml)")
    p.add_argument("count", type=int, help="how many sandboxes the batch will claim")
    p.add_argument(
        "--within", type=float, default=0.0, help="seconds until the batch arrives (default 0)"
    )
    add_flag(p)
    p.set_defaults(run=cmd_pool_hint)


HEADER = ["TEMPLATE", "IMAGE", "READY", "PENDING", "CLAIMED", "MIN", "MAX", "TARGET", "HITS",
          "MISSES", "HIT RATE", "CLAIMS/S", "REFILL S"]  # fmt: skip


def _row(p: PoolInfo) -> list[str]:
    return [
        p.template, p.image or "(default)", str(p.ready), str(p.pending), str(p.claimed),
        str(p.min), str(p.max), str(p.target), str(p.hits), str(p.misses),
        f"{p.hit_rate:.0%}" if p.hits + p.misses else "-", f"{p.claim_rate:.2f}",
        f"{p.refill_seconds:.3f}",
    ]  # fmt: skip


def cmd_pool_ls(args: argparse.Namespace) -> int:
    pools = client(args).pools.list()
    if args.json:
        print_lines(pools)
        return 0
    print_table(HEADER, [_row(p) for p in pools])
    return 0


def cmd_pool_hint(args: argparse.Namespace) -> int:
    pool = client(args).pools.hint(args.template, args.count, args.within)
    if args.json:
        print_lines([pool])
        return 0
    print_table(HEADER, [_row(pool)])
    return 0
