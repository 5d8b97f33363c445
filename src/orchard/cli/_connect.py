"""The CLI's one client: built once per command from the global flags."""

from __future__ import annotations

import argparse

from orchard.client import TLS, Orchard


def tls(args: argparse.Namespace) -> TLS | None:
    """``--tls-*`` as a :class:`TLS`, or None when none was given (the client resolves it)."""
    ca, cert, key, name = (
        getattr(args, flag, None) for flag in ("tls_ca", "tls_cert", "tls_key", "tls_server_name")
    )
    if ca is None and cert is None and key is None and name is None:
        return None
    return TLS(ca=ca, cert=cert, key=key, server_name=name)


def client(args: argparse.Namespace) -> Orchard:
    """The :class:`Orchard` client of this command (``--endpoint``, ``--api-key``,
    ``--data-plane``, ``--tls-*``, else the environment and the local stack's files)."""
    made: Orchard | None = getattr(args, "_client", None)
    if made is None:
        made = Orchard(args.endpoint, args.api_key, data_plane=args.data_plane, tls=tls(args))
        args._client = made
    return made
