"""``python -m orchard.gateway --home H --listen ADDR --scheduler ADDR [--http-listen ADDR] [--metrics-listen ADDR]``.

Prints the address it serves on once ready and writes it to
``<home>/run/gateway.addr`` (where the SDK and CLI look for the endpoint); the
REST front's address goes to ``run/gateway-http.addr`` and the metrics port's
to ``run/gateway.metrics.addr``. With ``--tls-cert``/``--tls-key`` both fronts
serve TLS and the addresses are written as ``grpcs://host:port`` and
``https://host:port``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from orchard.common.internal_pki import InternalPKIError
from orchard.common.layout import orchard_home
from orchard.common.process import announce_address, start_service
from orchard.common.tls import tls_from_arguments
from orchard.common.tls_args import add_tls_arguments, upstream_ca

from .auth import KEY_FILE
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
    parser.add_argument(
        "--http-listen", default=None, help="serve the REST/JSON front here (port 0: a free one)"
    )
    parser.add_argument(
        "--metrics-listen", default=None, help="serve Prometheus /metrics here (port 0: a free one)"
    )
    parser.add_argument(
        "--create-slots",
        type=int,
        default=8,
        help="creates forwarded at once; the rest wait in the fair per-tenant queue",
    )
    parser.add_argument(
        "--no-data-plane-proxy",
        action="store_true",
        help="do not serve ExecutorService (clients must reach the node executors directly)",
    )
    parser.add_argument(
        "--tenants-dir",
        type=Path,
        default=None,
        help="read api_keys.json and quotas.json from this folder (e.g. a mounted Secret)",
    )
    parser.add_argument(
        "--health-listen",
        default=None,
        help="also serve only grpc.health.v1, in plaintext, here (for probes that cannot do TLS)",
    )
    add_tls_arguments(
        parser, upstream="the CA of TLS node executors' certificates (none: the system's roots)"
    )
    args = parser.parse_args(argv)
    tls = tls_from_arguments(parser, args)
    if args.create_slots < 1:
        parser.error("--create-slots must be >= 1")
    if args.tenants_dir is not None and not (args.tenants_dir / KEY_FILE).is_file():
        # A missing mount must not start a gateway that silently refuses every key.
        parser.error(f"--tenants-dir {args.tenants_dir}: no {KEY_FILE} there")
    return GatewaySettings(
        home=args.home or orchard_home(),
        scheduler=args.scheduler,
        listen=args.listen,
        create_dev_key=not args.no_dev_key,
        http_listen=args.http_listen,
        metrics_listen=args.metrics_listen,
        create_slots=args.create_slots,
        data_plane_proxy=not args.no_data_plane_proxy,
        tls=tls,
        upstream_ca=upstream_ca(args),
        tenants_dir=args.tenants_dir,
        health_listen=args.health_listen,
    )


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    start_service("gateway")
    try:
        asyncio.run(serve(settings, on_ready=announce_address))
    except InternalPKIError as err:  # no internal certificate: say which file, no traceback
        sys.exit(f"orchard.gateway: {err}")


if __name__ == "__main__":
    main()
