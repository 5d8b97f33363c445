"""The ``orchard`` command line.

    orchard --version                              print the installed version
    orchard up [--home H] [--port 50051]          run the embedded default stack (needs [server,rewards])
    orchard create [--image I | --template T] ...  print the new sandbox's id
    orchard exec ID [--timeout S] -- CMD ARGS...   stream output, exit with its code
    orchard cp SRC DST                             ID:/path on either side
    orchard ls [--json] | orchard info ID [--json]
    orchard rm ID... | rm --all | rm --label K=V [--yes]
    orchard image ls [--json] | import SOURCE --name N | build-default | pull REF
    orchard reward grade INSTANCE.json PATCH | reward rank TASK CANDIDATES.jsonl
    orchard tenant create|ls|revoke|rotate-key|quota   tenants, API keys, quotas (node admin)
    orchard token-key ls | rotate [--drop KID]     data-plane token keys (node admin)
    orchard certs ls | rotate                      internal CA and service certificates (node admin)
    orchard pool ls [--json] | hint TEMPLATE N [--within S]  warm pools of templates
    orchard net set ID MODE [--cidr C] [--port P] [--domain D] | net show ID
    orchard port-forward ID PORT [--local-port N]  reach a port inside from 127.0.0.1 (Ctrl-C stops)

The global flags (``--endpoint``, ``--api-key``, ``--data-plane``, ``--tls-*``)
go before or after the subcommand (``_global_flags``). Every listing takes
``--json`` (JSON Lines, ``_json``). ``docs/reference/cli.md`` is generated from
these parsers (``scripts/gen_cli_reference.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from orchard import __version__
from orchard.client import OrchardError

from . import (
    _certs,
    _delete,
    _global_flags,
    _images,
    _info,
    _network,
    _pools,
    _ports,
    _rewards,
    _sandboxes,
    _shell,
    _tenants,
    _token_keys,
    _up,
)

EXIT_CODES = """exit codes:
  0    success
  1    an Orchard error (one line on stderr, no traceback)
  2    bad usage (argparse's message, or a refusal such as rm --all without --yes
       and no terminal)
  130  interrupted (Ctrl-C); 141 stdout's reader went away (orchard ls | head)
  orchard exec exits with the command's own code: 128+N when signal N killed it,
  124 when it timed out (like GNU timeout)
  orchard reward grade: 3 graded but not resolved, 4 infrastructure failure"""


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: argparse matches abbreviations of the top level's options against
    # every argument, even after the subcommand, so `orchard up --tls` would be "ambiguous"
    # beside the global --tls-ca/--tls-cert/... (subcommands keep their own abbreviations).
    parser = argparse.ArgumentParser(
        prog="orchard", description="Orchard Env: sandboxes for AI agents.", allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_CODES,
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"orchard {__version__}")
    _global_flags.add(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _up.register(commands)
    _sandboxes.register(commands)
    _info.register(commands)
    _delete.register(commands)
    _shell.register(commands)
    _images.register(commands)
    _tenants.register(commands)
    _token_keys.register(commands)
    _certs.register(commands)
    _pools.register(commands)
    _network.register(commands)
    _rewards.register(commands)
    _ports.register(commands)
    _global_flags.spread(parser)
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
