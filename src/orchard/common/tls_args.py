"""The TLS flags every service takes, and their environment variables.

Kept apart from ``tls.py`` (which imports grpc) so that the nginx data-plane
wrapper, a small process that never loads grpc, parses the same flags the same way.
A flag wins over its variable; :func:`tls_paths` and :func:`upstream_ca` apply that.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

ENV_CERT = "ORCHARD_TLS_CERT"
ENV_KEY = "ORCHARD_TLS_KEY"
ENV_CLIENT_CA = "ORCHARD_TLS_CLIENT_CA"
ENV_UPSTREAM_CA = "ORCHARD_TLS_UPSTREAM_CA"

_SERVER_FLAGS = (
    ("--tls-cert", ENV_CERT, "serve TLS with this PEM certificate chain (none: plaintext)"),
    ("--tls-key", ENV_KEY, "the certificate's PEM private key"),
    ("--tls-client-ca", ENV_CLIENT_CA, "require client certificates from this CA: mutual TLS"),
)


def add_tls_arguments(parser: argparse.ArgumentParser, *, upstream: str | None = None) -> None:
    """``--tls-cert``, ``--tls-key``, ``--tls-client-ca`` and, when ``upstream`` is its help
    text, ``--tls-upstream-ca`` (the CA of the certificates of the peers the service dials)."""
    flags = [*_SERVER_FLAGS]
    if upstream is not None:
        flags.append(("--tls-upstream-ca", ENV_UPSTREAM_CA, upstream))
    for flag, env, text in flags:
        parser.add_argument(flag, type=Path, default=None, help=f"{text} (default ${env})")


def _pick(flag: Path | None, env: Mapping[str, str], name: str) -> Path | None:
    if flag is not None:
        return flag
    value = env.get(name)
    return Path(value) if value else None


def tls_paths(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> tuple[Path | None, Path | None, Path | None]:
    """Certificate, key and client CA: each flag, else its variable."""
    env = os.environ if environ is None else environ
    return (
        _pick(args.tls_cert, env, ENV_CERT),
        _pick(args.tls_key, env, ENV_KEY),
        _pick(args.tls_client_ca, env, ENV_CLIENT_CA),
    )


def upstream_ca(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Path | None:
    """``--tls-upstream-ca``, else ``$ORCHARD_TLS_UPSTREAM_CA``."""
    return _pick(args.tls_upstream_ca, os.environ if environ is None else environ, ENV_UPSTREAM_CA)
