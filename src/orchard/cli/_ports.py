"""``orchard port-forward ID PORT [--local-port N] [--host H]``: a local listener whose
connections reach ``PORT`` on the sandbox's loopback (``Sandbox.forward_port``), until
Ctrl-C or SIGTERM. The first line on stdout is the local URL (``http://127.0.0.1:NNNN``),
so scripts can read it; each failed connection is reported on stderr."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from ._connect import client


def register(commands: Any) -> None:
    p = commands.add_parser(
        "port-forward", help="reach a TCP port inside a sandbox from 127.0.0.1 (until Ctrl-C)"
    )
    p.add_argument("id")
    p.add_argument("port", type=int, help="the port inside the sandbox")
    p.add_argument(
        "--local-port", type=int, default=0, help="local port on 127.0.0.1 (default: a free one)"
    )
    p.add_argument("--host", default="127.0.0.1", help="inside: 127.0.0.1 (default) or ::1")
    p.set_defaults(run=cmd_port_forward)


def cmd_port_forward(args: argparse.Namespace) -> int:
    sandbox = client(args).sandboxes.connect(args.id)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("orchard: %(message)s"))
    logging.getLogger("orchard.ports").addHandler(handler)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with sandbox.forward_port(args.port, local_port=args.local_port, host=args.host) as fwd:
        print(fwd.url, flush=True)
        print(
            f"orchard: forwarding {fwd.local_address[0]}:{fwd.local_port} -> "
            f"{args.id} port {args.port} (Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    return 0
