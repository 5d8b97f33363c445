"""``python -m orchard.rewards --home H --listen ADDR --gateway ADDR [--value-model M.npz]``.

Prints the address it serves on once ready and writes ``<home>/run/rewards.addr``.
The judge's endpoint comes from ORCHARD_JUDGE_BASE_URL, ORCHARD_JUDGE_MODEL and
ORCHARD_JUDGE_API_KEY (unset: Judge and ScoreProcess answer "no verdict").
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from orchard.common.layout import orchard_home
from orchard.common.process import announce_address, start_service
from orchard.common.tls import tls_from_arguments
from orchard.common.tls_args import add_tls_arguments

from .server import serve
from .settings import RewardSettings


def parse_args(argv: list[str] | None = None) -> RewardSettings:
    parser = argparse.ArgumentParser(prog="python -m orchard.rewards", description=__doc__)
    parser.add_argument("--home", type=Path, default=None, help="node home (default $ORCHARD_HOME)")
    parser.add_argument("--listen", default="127.0.0.1:50061", help="address (port 0: a free one)")
    parser.add_argument(
        "--gateway", default=None, help="gateway address (default <home>/run/gateway.addr)"
    )
    parser.add_argument(
        "--value-model",
        type=Path,
        default=None,
        help="trained reranker (.npz; default <home>/rewards/value_model.npz if present)",
    )
    parser.add_argument("--max-concurrent-grades", type=int, default=8)
    parser.add_argument(
        "--gateway-ca",
        type=Path,
        default=os.environ.get("ORCHARD_TLS_CA") or None,
        help="CA of a grpcs:// gateway's certificate (default $ORCHARD_TLS_CA)",
    )
    add_tls_arguments(parser)
    args = parser.parse_args(argv)
    tls = tls_from_arguments(parser, args)
    home = args.home or orchard_home()
    gateway = args.gateway
    if not gateway:
        try:
            gateway = (home / "run" / "gateway.addr").read_text().strip()
        except OSError:
            parser.error("no --gateway and no <home>/run/gateway.addr (is the stack up?)")
    value_model = args.value_model
    if value_model is None and (home / "rewards" / "value_model.npz").exists():
        value_model = home / "rewards" / "value_model.npz"  # the node's trained reranker, if any
    return RewardSettings(
        home=home, gateway=gateway, listen=args.listen, value_model=value_model,
        max_concurrent_grades=args.max_concurrent_grades, gateway_ca=args.gateway_ca, tls=tls,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    start_service("rewards")
    asyncio.run(serve(settings, on_ready=announce_address))


if __name__ == "__main__":
    main()
