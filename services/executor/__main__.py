"""``python -m orchard.executor --home H --listen ADDR``: serve ExecutorService.

Prints the address it serves on (one line, flushed; the real port when
``--listen`` asks for port 0) once it is ready, and writes it to
``<home>/run/executor.addr``. SIGTERM/SIGINT stop it gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

import uvloop

from orchard.common.layout import orchard_home

from .logs import configure_logging
from .server import serve
from .settings import MIB, ExecutorSettings


def parse_args(argv: list[str] | None = None) -> ExecutorSettings:
    parser = argparse.ArgumentParser(prog="python -m orchard.executor", description=__doc__)
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="node home (default $ORCHARD_HOME or /var/lib/orchard)",
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:0", help="address to serve on (port 0: pick a free one)"
    )
    parser.add_argument(
        "--max-output-mib", type=int, default=16, help="default per-stream output cap, MiB"
    )
    args = parser.parse_args(argv)
    return ExecutorSettings(
        home=args.home or orchard_home(),
        listen=args.listen,
        max_output_bytes=args.max_output_mib * MIB,
    )


async def _run(settings: ExecutorSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await serve(settings, stop)


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    configure_logging()
    uvloop.install()
    asyncio.run(_run(settings))


if __name__ == "__main__":
    main()
