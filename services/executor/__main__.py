"""``python -m orchard.executor --home H --listen ADDR``: serve ExecutorService.

Prints the address it serves on (one line, flushed; the real port when
``--listen`` asks for port 0) once it is ready, and writes it to
``<home>/run/executor.addr``. SIGTERM/SIGINT stop it gracefully.

``--in-sandbox RUN_DIR`` is the injected mode (started from the executor
bundle inside the sandbox it serves): one sandbox, rootfs ``/``, its
sandbox.json and init.sock in RUN_DIR, the address written to
RUN_DIR/executor.addr; see :mod:`orchard.executor.bundle`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
from pathlib import Path

from orchard.common.layout import orchard_home
from orchard.common.metrics import metrics_token_file, serve_metrics
from orchard.common.process import start_service
from orchard.common.tls import tls_from_arguments
from orchard.common.tls_args import add_tls_arguments

from .in_sandbox import TOKEN_KEY_FILE, take_token_key
from .server import serve
from .settings import MIB, ExecutorSettings


def _env_number(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def with_shares(settings: ExecutorSettings) -> ExecutorSettings:
    """``settings`` with the fair shares of the node's pools (settings.py) from the environment."""
    return dataclasses.replace(
        settings,
        output_bytes_per_sandbox=_env_number("ORCHARD_OUTPUT_MIB_PER_SANDBOX", 512) * MIB,
        output_bytes_per_tenant=_env_number("ORCHARD_OUTPUT_MIB_PER_TENANT", 1024) * MIB,
        output_bytes_node=_env_number("ORCHARD_OUTPUT_MIB_NODE", 2048) * MIB,
        output_bytes_per_second_per_tenant=_env_number(
            "ORCHARD_OUTPUT_MIB_PER_SECOND_PER_TENANT", 64
        )
        * MIB,
        sessions_per_sandbox=_env_number("ORCHARD_SESSIONS_PER_SANDBOX", 32),
        sessions_per_tenant=_env_number("ORCHARD_SESSIONS_PER_TENANT", 512),
        port_connections_per_sandbox=_env_number("ORCHARD_PORT_CONNECTIONS_PER_SANDBOX", 64),
        port_connections_per_tenant=_env_number("ORCHARD_PORT_CONNECTIONS_PER_TENANT", 512),
        port_connections_node=_env_number("ORCHARD_PORT_CONNECTIONS_NODE", 4096),
        processes_per_sandbox=_env_number("ORCHARD_PROCESSES_PER_SANDBOX", 64),
        process_buffer_bytes=_env_number("ORCHARD_PROCESS_BUFFER_KIB", 1024) * 1024,
        finished_process_seconds=float(os.environ.get("ORCHARD_FINISHED_PROCESS_SECONDS") or 600),
    )


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
    parser.add_argument(
        "--stream-idle-seconds",
        type=float,
        default=float(os.environ.get("ORCHARD_STREAM_IDLE_SECONDS") or 300),
        help="end a request stream that sends nothing for this long (default 300, "
        "$ORCHARD_STREAM_IDLE_SECONDS)",
    )
    parser.add_argument(
        "--max-small-messages",
        type=int,
        default=int(os.environ.get("ORCHARD_MAX_SMALL_MESSAGES") or 16384),
        help="refuse a request stream sending more messages under 4 KiB than this "
        "(default 16384, $ORCHARD_MAX_SMALL_MESSAGES)",
    )
    parser.add_argument(
        "--small-messages-per-second",
        type=float,
        default=float(os.environ.get("ORCHARD_SMALL_MESSAGES_PER_SECOND") or 1000),
        help="per-stream pace of request messages under 4 KiB (default 1000, 0 = unpaced, "
        "$ORCHARD_SMALL_MESSAGES_PER_SECOND)",
    )
    parser.add_argument(
        "--in-sandbox",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="injected mode: serve only the sandbox this process runs in (RUN_DIR holds "
        "sandbox.json, init.sock and token.key)",
    )
    add_tls_arguments(parser)
    args = parser.parse_args(argv)
    tls = tls_from_arguments(parser, args)
    if args.in_sandbox is not None:
        run_dir: Path = args.in_sandbox
        return ExecutorSettings(
            home=run_dir,
            listen=args.listen,
            max_output_bytes=args.max_output_mib * MIB,
            stream_idle_seconds=args.stream_idle_seconds,
            max_small_messages_per_stream=args.max_small_messages,
            small_messages_per_second=args.small_messages_per_second,
            in_sandbox_run_dir=run_dir,
            token_key=take_token_key(run_dir / TOKEN_KEY_FILE),
            tls=tls,
        )
    return with_shares(
        ExecutorSettings(
            home=args.home or orchard_home(),
            listen=args.listen,
            max_output_bytes=args.max_output_mib * MIB,
            stream_idle_seconds=args.stream_idle_seconds,
            max_small_messages_per_stream=args.max_small_messages,
            small_messages_per_second=args.small_messages_per_second,
            tls=tls,
        )
    )


def _metrics_listen(argv: list[str] | None) -> tuple[list[str] | None, str | None]:
    """Take ``--metrics-listen ADDR`` out of ``argv`` (Prometheus /metrics; port 0: a free one)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--metrics-listen", default=None)
    known, rest = parser.parse_known_args(argv)
    return rest, known.metrics_listen


def main(argv: list[str] | None = None) -> None:
    argv, metrics_listen = _metrics_listen(argv)
    settings = parse_args(argv)
    start_service("executor")
    if metrics_listen is not None:
        serve_metrics(
            metrics_listen,
            metrics_token_file(settings.layout.home),
            settings.layout.run / "executor.metrics.addr",
        )
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
