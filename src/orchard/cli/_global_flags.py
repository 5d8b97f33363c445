"""The CLI's global flags (where to connect, with which key, over which TLS), accepted anywhere.

argparse takes a parser's options only before its subcommand, so ``orchard ls
--api-key K`` would be a usage error although ``orchard --api-key K ls`` works.
:func:`spread` adds the same flags to every subcommand's parser with
``default=SUPPRESS``: a flag given after the subcommand overrides the one given
before it, and a flag not given there leaves the top level's value alone
(argparse copies only the attributes a subparser actually set). ``orchard up``
is left out: it is the server, and ``--endpoint`` there would read as its own
address, silently unused.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

NOT_SPREAD = frozenset({"up"})
"""Top-level commands that take no client flags (they do not talk to a gateway)."""


GROUP_TITLE = "global flags (also accepted before the command)"


def add(parser: argparse.ArgumentParser, *, below_subcommand: bool = False) -> None:
    """Add the global flags to ``parser`` (``below_subcommand``: defaults left to the top,
    and listed apart in the subcommand's help)."""
    extra: dict[str, Any] = {"default": argparse.SUPPRESS} if below_subcommand else {}
    group: Any = parser.add_argument_group(GROUP_TITLE) if below_subcommand else parser
    group.add_argument(
        "--endpoint",
        help="gateway address, host:port or grpcs://host:port "
        "(default $ORCHARD_ENDPOINT or the local stack's run/gateway.addr)",
        **extra,
    )
    group.add_argument(
        "--api-key", help="API key (default $ORCHARD_API_KEY or the local dev key)", **extra
    )
    group.add_argument(
        "--data-plane",
        choices=("direct", "proxy"),
        help="exec/file calls straight to the node executor or through the gateway "
        "(default $ORCHARD_DATA_PLANE or direct)",
        **extra,
    )
    group.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="CA file to trust for a grpcs:// endpoint (default $ORCHARD_TLS_CA, "
        "the local stack's run/ca.pem, else the system's roots)",
        **extra,
    )
    group.add_argument(
        "--tls-cert",
        metavar="PEM",
        help="client certificate for mutual TLS, with --tls-key (default $ORCHARD_TLS_CERT)",
        **extra,
    )
    group.add_argument(
        "--tls-key",
        metavar="PEM",
        help="the client certificate's key (default $ORCHARD_TLS_KEY)",
        **extra,
    )
    group.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="name to check the server's certificate against instead of the host dialled",
        **extra,
    )


def subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every (name, parser) directly below ``parser``, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases map to the same parser
                    seen.add(id(sub))
                    yield name, sub


def spread(parser: argparse.ArgumentParser) -> None:
    """Give every parser below the top one the global flags (but :data:`NOT_SPREAD`)."""
    for name, sub in subparsers(parser):
        if name not in NOT_SPREAD:
            _spread_all(sub)


def _spread_all(parser: argparse.ArgumentParser) -> None:
    add(parser, below_subcommand=True)
    for _, sub in subparsers(parser):
        _spread_all(sub)
