"""``orchard certs ...``: the internal CA and the services' certificates of a node (node admin).

    orchard certs ls [--json]     each certificate: its identity, issuer, when it expires
    orchard certs rotate          a new internal CA and new certificates for every service

The scheduler admits only the gateway's certificate (``orchard.common.internal_pki``).
Services read their certificates when they start: after a rotation restart the stack
(``orchard up``), and every certificate of the old CA is refused from then on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from orchard.client import OrchardError
from orchard.common.layout import orchard_home

from . import _extras


class CertsCommandError(OrchardError):
    """A certs command could not be done."""


def register(commands: Any) -> None:
    p = commands.add_parser("certs", help="internal CA and service certificates: ls, rotate")
    p.add_argument(
        "--home",
        type=Path,
        default=None,
        help="node home (default $ORCHARD_HOME or /var/lib/orchard)",
    )
    sub = p.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    ls = sub.add_parser("ls", help="each service's certificate and when it expires")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    ls.set_defaults(run=cmd_ls)
    rotate = sub.add_parser("rotate", help="a new internal CA and new service certificates")
    rotate.set_defaults(run=cmd_rotate)


def _pki(args: argparse.Namespace) -> Any:
    _extras.require("orchard certs", ("server",))
    from orchard.common.internal_pki import InternalPKI

    return InternalPKI.of_home((args.home or orchard_home()).resolve())


def _describe(path: Path) -> dict[str, str]:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as err:
        return {"file": str(path), "error": str(err)}
    return {
        "file": str(path),
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "expires": cert.not_valid_after_utc.isoformat(timespec="seconds"),
        "days_left": str((cert.not_valid_after_utc - dt.datetime.now(dt.UTC)).days),
    }


def cmd_ls(args: argparse.Namespace) -> int:
    from orchard.common.internal_pki import SERVICES

    pki = _pki(args)
    if not pki.ca_file.exists():
        raise CertsCommandError(f"no internal CA in {pki.root} (orchard up issues it)")
    rows = [{"name": "ca", **_describe(pki.ca_file)}]
    rows += [{"name": s, **_describe(pki.cert_file(s))} for s in SERVICES]
    for row in rows:
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{row['name']:<10} {row.get('subject', row.get('error', '')):<32} "
                  f"expires {row.get('expires', '-')}  {row['file']}")  # fmt: skip
    return 0


def cmd_rotate(args: argparse.Namespace) -> int:
    from orchard.common.internal_pki import SERVICES, InternalPKIError

    pki = _pki(args)
    try:
        pki.rotate(SERVICES)
    except (OSError, ValueError, InternalPKIError) as err:
        raise CertsCommandError(
            f"cannot rotate the internal certificates in {pki.root}: {err}"
        ) from None
    print(f"new internal CA and certificates for {', '.join(SERVICES)} in {pki.root}")
    print("restart the stack (orchard up) so every service uses them; the old ones are refused")
    return 0
