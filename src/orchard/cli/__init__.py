"""The ``orchard`` command line.

    orchard --version                              print the installed version
    orchard up [--home H] [--port 50051]          run the embedded default stack (needs [server,rewards])
    orchard create [--image I] [--cpu C] ...       print the new sandbox's id
    orchard exec ID [--timeout S] -- CMD ARGS...   stream output, exit with its code
    orchard cp SRC DST                             ID:/path on either side
    orchard ls | orchard rm ID...
    orchard image ls | import SOURCE --name N | build-default
    orchard reward grade INSTANCE.json PATCH | reward rank TASK CANDIDATES.jsonl
    orchard tenant create|ls|revoke|rotate-key|quota   tenants, API keys, quotas (node admin)
    orchard token-key ls | rotate [--drop KID]     data-plane token keys (node admin)
    orchard pool ls | hint TEMPLATE N [--within S]  warm pools of templates
    orchard net set ID MODE [--cidr C] [--port P] [--domain D] | net show ID

Exit codes: 0 success; 1 an Orchard error (message on stderr, no traceback);
2 bad usage. ``orchard exec`` exits with the command's own code, 128+N if a
signal N killed it, 124 if it timed out (like GNU ``timeout``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from orchard import __version__
from orchard.client import OrchardError

from . import _images, _network, _pools, _rewards, _sandboxes, _shell, _tenants, _token_keys, _up


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="orchard", description="Orchard Env: sandboxes for AI agents.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"orchard {__version__}")
    parser.add_argument(
        "--endpoint", help="gateway address (default $ORCHARD_ENDPOINT or the local stack's)"
    )
    parser.add_argument("--api-key", help="API key (default $ORCHARD_API_KEY or the local dev key)")
    parser.add_argument(
        "--data-plane",
        choices=("direct", "proxy"),
        help="exec/file calls straight to the node executor or through the gateway "
        "(default $ORCHARD_DATA_PLANE or direct)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _up.register(commands)
    _sandboxes.register(commands)
    _shell.register(commands)
    _images.register(commands)
    _tenants.register(commands)
    _token_keys.register(commands)
    _pools.register(commands)
    _network.register(commands)
    _rewards.register(commands)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``; for ``exec``, everything after the first ``--`` is the command, verbatim."""
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        if hasattr(args, "cmd"):
            args.cmd = [*args.cmd, *argv[cut + 1 :]]
            return args
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(parser, argv)
    try:
        code: int = args.run(args)
    except BrokenPipeError:
        return _reader_went_away()
    except OrchardError as exc:
        print(f"orchard: {exc.message}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _reader_went_away()
    return code


def _reader_went_away() -> int:
    """stdout's reader closed the pipe (``orchard ls | head``): not an error worth a traceback."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141  # 128 + SIGPIPE, as a shell pipeline reports it
