"""``orchard token-key ...``: the node admin's data-plane token keys (files under the home).

    orchard token-key ls [--json]          key ids, which one is current, when each was made
    orchard token-key rotate [--drop KID]  a new current key; --drop retires old ones

Tokens name the key that signed them, so a rotation keeps every token already
issued valid. A dropped key's tokens stop working within about a second
everywhere: the node executor and the gateway re-read the keyring, and the
scheduler, seeing the drop recorded in it, tells each sandbox that runs its own
executor (injected, runsc, a Kubernetes pod) with a key-drop notice signed with a
live key it holds. A local sandbox that holds no live key (made when the ring
held only keys now dropped) cannot be told and is deleted; such a Kubernetes pod
is only logged (``docs/kubernetes.md``). Each sandbox's tokens are signed with a
key derived for that sandbox (``orchard.common.tokens``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from orchard.client import OrchardError
from orchard.common.layout import NodeLayout, orchard_home
from orchard.common.tokens import TokenError


class TokenKeyCommandError(OrchardError):
    """A token-key command could not be done."""


def register(commands: Any) -> None:
    p = commands.add_parser("token-key", help="data-plane token keys: list, rotate (node admin)")
    p.add_argument(
        "--home",
        type=Path,
        default=None,
        help="node home (default $ORCHARD_HOME or /var/lib/orchard)",
    )
    sub = p.add_subparsers(dest="token_key_command", required=True, metavar="ACTION")
    ls = sub.add_parser("ls", help="key ids, the current one, when each was made")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    ls.set_defaults(run=cmd_ls)
    rotate = sub.add_parser("rotate", help="make a new current key (old tokens stay valid)")
    rotate.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="KID",
        help="retire this key id too: its tokens stop working (local sandboxes holding "
        "no other live key are deleted)",
    )
    rotate.set_defaults(run=cmd_rotate)


def _layout(args: argparse.Namespace) -> NodeLayout:
    return NodeLayout((args.home or orchard_home()).resolve())


def _made(kid: str) -> str:
    digits = kid[1:]
    if not digits.isdigit() or digits == "0":
        return "(before keyrings)"
    return dt.datetime.fromtimestamp(int(digits) / 1e9, dt.UTC).isoformat(timespec="seconds")


def cmd_ls(args: argparse.Namespace) -> int:
    try:
        ring = _layout(args).keyring_file().ring()
    except (TokenError, OSError) as exc:
        raise TokenKeyCommandError(str(exc)) from None
    for kid in sorted(ring.keys):
        current = kid == ring.current
        if args.json:
            print(json.dumps({"kid": kid, "current": current, "made": _made(kid)}))
        else:
            print(f"{kid:<24} {'current' if current else '':<8} {_made(kid)}")
    return 0


def cmd_rotate(args: argparse.Namespace) -> int:
    try:
        kid = _layout(args).keyring_file().rotate(drop=tuple(args.drop))
    except (TokenError, OSError) as exc:
        raise TokenKeyCommandError(str(exc)) from None
    print(kid)
    return 0
