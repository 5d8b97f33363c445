"""Real certificates made in the test with ``cryptography`` (through orchard.common.local_ca):
a CA, a second unrelated CA, a current and an expired server certificate, a client one."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from orchard.common.local_ca import cert_pem, issue, key_pem, make_ca

SERVER_NAMES = ["localhost", "127.0.0.1", "::1"]


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    other_ca: Path
    server: Pair
    expired_server: Pair
    client: Pair
    other_client: Pair
    """Issued by ``other_ca``: a client certificate the server must not accept."""


def _write_pair(folder: Path, name: str, cert: bytes, key: bytes) -> Pair:
    (folder / f"{name}.pem").write_bytes(cert)
    (folder / f"{name}.key").write_bytes(key)
    (folder / f"{name}.key").chmod(0o600)
    return Pair(folder / f"{name}.pem", folder / f"{name}.key")


def make_certs(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = make_ca("test CA")
    other, other_key = make_ca("someone else's CA")
    (folder / "ca.pem").write_bytes(cert_pem(ca))
    (folder / "other-ca.pem").write_bytes(cert_pem(other))
    server, server_key = issue(ca, ca_key, SERVER_NAMES)
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    expired, expired_key = issue(ca, ca_key, SERVER_NAMES, not_before=long_ago, days=1)
    client, client_key = issue(ca, ca_key, ["trainer-1"])
    stranger, stranger_key = issue(other, other_key, ["trainer-2"])
    return Certs(
        ca=folder / "ca.pem",
        other_ca=folder / "other-ca.pem",
        server=_write_pair(folder, "server", cert_pem(server), key_pem(server_key)),
        expired_server=_write_pair(folder, "expired", cert_pem(expired), key_pem(expired_key)),
        client=_write_pair(folder, "client", cert_pem(client), key_pem(client_key)),
        other_client=_write_pair(folder, "stranger", cert_pem(stranger), key_pem(stranger_key)),
    )
