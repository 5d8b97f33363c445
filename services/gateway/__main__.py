"""``python -m orchard.gateway --home H --listen ADDR --scheduler ADDR``.

Prints the address it serves on once ready and writes it to
``<home>/run/gateway.addr`` (where the SDK and CLI look for the endpoint).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import uvloop

from orchard.common.layout import orchard_home

from .logs import configure_logging
from .server import serve
from .settings import GatewaySettings


def parse_args(argv: list[str] | None = None) -> GatewaySettings:
    parser = argparse.ArgumentParser(prog="python -m orchard.gateway", description=__doc__)
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="node home (default $ORCHARD_HOME or /var/lib/orchard)",
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:50051", help="public address (port 0: pick a free one)"
    )
    parser.add_argument("--scheduler", required=True, help="the scheduler's address")
    parser.add_argument(
        "--no-dev-key", action="store_true", help="do not create the dev tenant's key"
    )
    args = parser.parse_args(argv)
    return GatewaySettings(
        home=args.home or orchard_home(),
        scheduler=args.scheduler,
        listen=args.listen,
        create_dev_key=not args.no_dev_key,
    )


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    configure_logging()
    uvloop.install()

    def ready(address: str) -> None:
        print(address, flush=True)

    asyncio.run(serve(settings, on_ready=ready))


if __name__ == "__main__":
    main()
