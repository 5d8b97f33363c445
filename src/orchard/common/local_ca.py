"""A local certificate authority for ``orchard up --tls`` (and the tests' certificates).

Why our own code at all: ``orchard up --tls`` must work on a fresh machine with no
cert-manager, no step-ca and no openssl command line. What we write is only the
choice of fields; every piece of cryptography (keys, signatures, X.509 encoding)
is the ``cryptography`` package's.

Files (:class:`LocalCA`), under ``<home>/secrets/tls/`` (0700; keys 0600):
``ca.pem`` / ``ca.key`` (the CA, ten years), ``server.pem`` / ``server.key`` (one
certificate every service of the stack serves, valid for ``localhost``, the
loopback addresses and the hosts ``orchard up --host`` names; one year; remade when
a needed name is missing or less than 30 days are left). Its extended key usage
allows both server and client auth, so a service presents it when it calls another
one that asks for client certificates. Clients find the CA at ``<home>/run/ca.pem``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 365
RENEW_BEFORE_DAYS = 30
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

Key = ec.EllipticCurvePrivateKey


def new_key() -> Key:
    """A P-256 key: what every TLS stack here (BoringSSL in grpc, OpenSSL in nginx) takes."""
    return ec.generate_private_key(ec.SECP256R1())


def _san(names: Iterable[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name.strip("[]"))))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def make_ca(
    common_name: str = "Orchard local CA",
    *,
    not_before: dt.datetime | None = None,
    days: int = CA_DAYS,
    key: Key | None = None,
) -> tuple[x509.Certificate, Key]:
    key = key or new_key()
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue(
    ca: x509.Certificate,
    ca_key: Key,
    names: Sequence[str],
    *,
    not_before: dt.datetime | None = None,
    days: int = LEAF_DAYS,
    key: Key | None = None,
) -> tuple[x509.Certificate, Key]:
    """A leaf certificate for ``names`` (DNS names or IP addresses; the first is also the
    common name), usable as a server and as a client certificate."""
    if not names:
        raise ValueError("a certificate needs at least one name")
    key = key or new_key()
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_file(path: Path, data: bytes, mode: int) -> None:
    """``data`` into ``path`` with ``mode`` from the first byte (a key is never world-readable,
    even for a moment), replaced atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class LocalCA:
    """The files of one home's local CA (see the module docstring)."""

    root: Path
    """``<home>/secrets/tls``."""

    @classmethod
    def of_home(cls, home: Path) -> LocalCA:
        return cls(home / "secrets" / "tls")

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key_file(self) -> Path:
        return self.root / "ca.key"

    @property
    def cert_file(self) -> Path:
        return self.root / "server.pem"

    @property
    def key_file(self) -> Path:
        return self.root / "server.key"

    def ensure(self, hosts: Iterable[str] = ()) -> None:
        """Make the CA if there is none, and a server certificate valid for the loopback
        names and ``hosts`` unless a current one already covers them."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        names = [*LOOPBACK_NAMES, *(h for h in hosts if h not in ("0.0.0.0", "::", ""))]
        if self.ca_file.exists() and self.ca_key_file.exists():
            ca = x509.load_pem_x509_certificate(self.ca_file.read_bytes())
            loaded = serialization.load_pem_private_key(self.ca_key_file.read_bytes(), None)
            if not isinstance(loaded, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{self.ca_key_file}: not an EC key (not made by orchard up)")
            ca_key = loaded
        else:
            ca, ca_key = make_ca()
            write_file(self.ca_key_file, key_pem(ca_key), 0o600)
            write_file(self.ca_file, cert_pem(ca), 0o644)
            self.key_file.unlink(missing_ok=True)  # a leaf of an older CA is of no use
        if self._current(ca, names):
            return
        leaf, leaf_key = issue(ca, ca_key, names)
        write_file(self.key_file, key_pem(leaf_key), 0o600)
        write_file(self.cert_file, cert_pem(leaf), 0o644)

    def _current(self, ca: x509.Certificate, names: Sequence[str]) -> bool:
        try:
            leaf = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
        except (OSError, ValueError):
            return False
        if not self.key_file.exists() or leaf.issuer != ca.subject:
            return False
        left = leaf.not_valid_after_utc - dt.datetime.now(dt.UTC)
        if left < dt.timedelta(days=RENEW_BEFORE_DAYS):
            return False
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have = {str(n) for n in san.get_values_for_type(x509.DNSName)} | {
            str(ip) for ip in san.get_values_for_type(x509.IPAddress)
        }
        wanted = {str(ipaddress.ip_address(n.strip("[]"))) if _is_ip(n) else n for n in names}
        return wanted <= have


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


__all__ = ["LocalCA", "cert_pem", "issue", "key_pem", "make_ca", "new_key", "write_file"]
