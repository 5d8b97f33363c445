"""The CLI's one client: built once per command from the global flags."""

from __future__ import annotations

import argparse

from orchard.client import Orchard


def client(args: argparse.Namespace) -> Orchard:
    """The :class:`Orchard` client of this command (``--endpoint``, ``--api-key``,
    ``--data-plane``, else the environment and the local stack's files)."""
    made: Orchard | None = getattr(args, "_client", None)
    if made is None:
        made = Orchard(args.endpoint, args.api_key, data_plane=args.data_plane)
        args._client = made
    return made
