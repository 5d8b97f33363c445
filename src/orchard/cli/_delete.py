"""``orchard rm ID... | rm --all | rm --label K=V``: delete sandboxes, by id or by selection.

Named ids are deleted at once, as ``rm FILE`` does. A selection (``--all``, or
every sandbox carrying all the ``--label`` pairs) is listed first and asked
about on the terminal, because one mistyped label must not take a training
run's thousand sandboxes with it; ``--yes`` skips the question for scripts.
Without a terminal to ask on and without ``--yes`` the command refuses (exit 2,
bad usage) rather than guess either way. Deletes run a few at a time (each
waits until its container is gone), and every id deleted is printed.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchard.client import Orchard, OrchardError

from ._connect import client
from ._sandboxes import pairs

EXIT_USAGE = 2
PARALLEL_DELETES = 8
"""Deletes in flight at once: each mostly waits on the node, so a few overlap well."""
SHOWN_IDS = 10
"""Ids listed in the question before ``... and N more``."""


def register(commands: Any) -> None:
    p = commands.add_parser(
        "rm",
        help="delete sandboxes by id, or every one (--all) or those with labels (--label)",
        description="Delete sandboxes. A selection (--all, --label) is confirmed on the "
        "terminal first unless --yes is given; without a terminal and without --yes it is "
        "refused (exit 2).",
    )
    p.add_argument("ids", nargs="*", metavar="ID", help="sandbox ids (deleted without asking)")
    p.add_argument("--all", action="store_true", help="every sandbox of your tenant")
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="K=V",
        help="every sandbox carrying this label (repeatable: all of them)",
    )
    p.add_argument(
        "-y", "--yes", action="store_true", help="do not ask before deleting a selection"
    )
    p.set_defaults(run=cmd_rm)


def _usage(message: str) -> int:
    print(f"orchard: rm: {message}", file=sys.stderr)
    return EXIT_USAGE


def _confirmed(ids: list[str], what: str) -> bool:
    shown = " ".join(ids[:SHOWN_IDS])
    more = f" ... and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else ""
    print(f"{what}: {len(ids)} sandbox(es): {shown}{more}", file=sys.stderr)
    print(f"Delete {len(ids)} sandbox(es)? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _delete_all(orchard: Orchard, ids: list[str]) -> int:
    failed = 0

    def delete(sandbox_id: str) -> tuple[str, OrchardError | None]:
        try:
            orchard.sandboxes.delete(sandbox_id)
        except OrchardError as exc:
            return sandbox_id, exc
        return sandbox_id, None

    with ThreadPoolExecutor(max_workers=min(PARALLEL_DELETES, max(1, len(ids)))) as pool:
        for sandbox_id, error in pool.map(delete, ids):
            if error is None:
                print(sandbox_id, flush=True)
            else:
                print(f"orchard: {sandbox_id}: {error.message}", file=sys.stderr)
                failed += 1
    return 1 if failed else 0


def cmd_rm(args: argparse.Namespace) -> int:
    selecting = args.all or bool(args.label)
    if args.ids and selecting:
        return _usage("give ids or a selection (--all, --label), not both")
    if args.all and args.label:
        return _usage("--all and --label exclude each other (--label already narrows)")
    if not args.ids and not selecting:
        return _usage("nothing to delete: give ids, --all or --label K=V")
    orchard = client(args)
    if not selecting:
        return _delete_all(orchard, list(args.ids))
    labels = pairs(args.label, "--label")
    what = "every sandbox" if args.all else "sandboxes with " + " ".join(args.label)
    ids = [info.id for info in orchard.sandboxes.list(labels or None)]
    if not ids:
        print(f"orchard: rm: no sandboxes match ({what})", file=sys.stderr)
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            return _usage(
                f"{what} would delete {len(ids)} sandbox(es) and there is no terminal to "
                "confirm on: pass --yes to delete without asking"
            )
        if not _confirmed(ids, what):
            print("orchard: rm: nothing deleted", file=sys.stderr)
            return 1
    return _delete_all(orchard, ids)
