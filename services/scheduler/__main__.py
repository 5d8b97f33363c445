"""``python -m orchard.scheduler --home H --listen ADDR --executor-address ADDR --backend local``.

Prints the address it serves on (one line, flushed) once it is ready, and
writes it to ``<home>/run/scheduler.addr``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from orchard.common.internal_pki import InternalPKIError
from orchard.common.layout import orchard_home
from orchard.common.process import announce_address, start_service

from .server import serve
from .settings import SchedulerSettings


def parse_args(argv: list[str] | None = None) -> SchedulerSettings:
    parser = argparse.ArgumentParser(prog="python -m orchard.scheduler", description=__doc__)
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
        "--executor-address",
        default="",
        help="the node executor's address, given to clients of sandboxes without their own "
        "executor (omit on Kubernetes: every pod runs its own)",
    )
    parser.add_argument(
        "--executor-tls",
        action="store_true",
        default=os.environ.get("ORCHARD_EXECUTOR_TLS", "") in ("1", "true", "yes"),
        help="the node executor at --executor-address serves TLS: clients are told to dial it "
        "with TLS (default $ORCHARD_EXECUTOR_TLS=1)",
    )
    parser.add_argument(
        "--executor-bundle",
        type=Path,
        default=None,
        help="local backend: run sandboxes injected, each with its own executor from this "
        "bundle (default $ORCHARD_EXECUTOR_BUNDLE; `python -m orchard.executor.bundle build` "
        "prints its path)",
    )
    parser.add_argument("--backend", default="local", help="backend name (default: local)")
    parser.add_argument(
        "--images-dir",
        type=Path,
        default=None,
        help="images folder (default $ORCHARD_IMAGES_DIR or <home>/images)",
    )
    parser.add_argument(
        "--init-binary",
        type=Path,
        default=None,
        help="orchard-init for the local backend (default $ORCHARD_INIT_BINARY; "
        "`python -m orchard.executor.initbin` builds it and prints its path)",
    )
    parser.add_argument(
        "--delete-all-on-shutdown",
        action="store_true",
        help="delete every sandbox on SIGTERM/SIGINT",
    )
    parser.add_argument(
        "--delete-waits-for-teardown",
        action="store_true",
        default=os.environ.get("ORCHARD_DELETE_WAITS_FOR_TEARDOWN", "") in ("1", "true", "yes"),
        help="answer a delete only once the container is gone (default: once it is DELETING; "
        "$ORCHARD_DELETE_WAITS_FOR_TEARDOWN=1)",
    )
    parser.add_argument(
        "--metrics-listen", default=None, help="serve Prometheus /metrics here (port 0: a free one)"
    )
    parser.add_argument(
        "--health-listen",
        default=None,
        help="also serve only grpc.health.v1, in plaintext, here (for probes that cannot do "
        "the scheduler's mutual TLS)",
    )
    args = parser.parse_args(argv)
    images_env = os.environ.get("ORCHARD_IMAGES_DIR")
    init_env = os.environ.get("ORCHARD_INIT_BINARY")
    bundle_env = os.environ.get("ORCHARD_EXECUTOR_BUNDLE")
    give_up_env = os.environ.get("ORCHARD_REVOCATION_GIVE_UP_SECONDS")
    return SchedulerSettings(
        home=args.home or orchard_home(),
        listen=args.listen,
        executor_address=args.executor_address,
        executor_tls=args.executor_tls,
        backend=args.backend,
        images_dir=args.images_dir or (Path(images_env) if images_env else None),
        init_binary=args.init_binary or (Path(init_env) if init_env else None),
        executor_bundle=args.executor_bundle or (Path(bundle_env) if bundle_env else None),
        delete_all_on_shutdown=args.delete_all_on_shutdown,
        delete_waits_for_teardown=args.delete_waits_for_teardown,
        metrics_listen=args.metrics_listen,
        health_listen=args.health_listen,
        revocation_give_up_seconds=float(give_up_env)
        if give_up_env
        else SchedulerSettings.revocation_give_up_seconds,
    )


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    start_service("scheduler")
    try:
        asyncio.run(serve(settings, on_ready=announce_address))
    except InternalPKIError as err:  # no internal certificate: say which file, no traceback
        sys.exit(f"orchard.scheduler: {err}")


if __name__ == "__main__":
    main()
