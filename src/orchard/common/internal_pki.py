"""Who an internal caller is: an internal CA and one certificate per service.

Why mutual TLS (and not a shared secret or Unix sockets): it is the one mechanism that
works the same on one machine and on Kubernetes (the scheduler is a TCP peer of the
gateway in both), it encrypts the gateway -> scheduler hop as well, and the private key
never travels (a bearer secret in metadata is replayable wherever it leaks). Every piece
of cryptography is the ``cryptography`` package's and gRPC's; ``local_ca`` chooses the
certificate fields.

Identities: a service's certificate names it as ``<service>.orchard.internal`` (its
common name and its one DNS subjectAltName). The CA is private to Orchard (it is not the
CA of ``orchard up --tls``, which clients trust), so only what it issued proves a name:
the server authorizes the name a caller's per-call signed credential proves (made with
its certificate's key, ``internal_credential``; ``caller_policy``), and the client checks that it reached the service it dialled by that same name
(:meth:`ServiceIdentity.channel_options` pins it with ``grpc.ssl_target_name_override``),
whatever address the service listens on.

Files, in ``<home>/secrets/internal/`` (0700, root's), or in ``$ORCHARD_INTERNAL_TLS_DIR``
(the chart mounts each service's Secret there): ``ca.pem`` (the CA certificate, the one
trust root of every internal hop), ``ca.key`` (only on a machine that issues: ``orchard
up``; never in a pod), ``<service>.pem`` / ``<service>.key`` (0600). ``orchard up``
issues every service's certificate before it starts them (:meth:`InternalPKI.ensure`:
made when missing, remade when less than 30 days are left or the CA changed);
``orchard certs rotate`` makes a new CA and new certificates (the stack reads them at
its next start). A service started alone on a machine issues its own from the same
folder; one without its files and without the CA key refuses to start.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .internal_credential import CredentialSigner, CredentialVerifier
from .local_ca import RENEW_BEFORE_DAYS, cert_pem, issue, key_pem, make_ca, write_file

ENV_INTERNAL_TLS_DIR = "ORCHARD_INTERNAL_TLS_DIR"
IDENTITY_SUFFIX = ".orchard.internal"
CA_NAME = "Orchard internal CA"
SERVICES = ("gateway", "scheduler")
"""The services with an internal identity: the scheduler serves only internal callers, the
gateway is its one caller. (The executor and the rewards service authenticate every call
with a sandbox token or an API key instead: their callers are clients.)"""


class InternalPKIError(RuntimeError):
    """The internal certificates cannot be read or issued (the message names the file)."""


def identity_name(service: str) -> str:
    """The name in ``service``'s certificate: ``<service>.orchard.internal``."""
    return f"{service}{IDENTITY_SUFFIX}"


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise InternalPKIError(
            f"internal TLS {what} {path}: {err.strerror or err} (orchard up issues it; "
            f"on Kubernetes the chart mounts it from a Secret at ${ENV_INTERNAL_TLS_DIR})"
        ) from None


@dataclass(frozen=True)
class ServiceIdentity:
    """One service's certificate, key and the internal CA: what it serves and dials with."""

    service: str
    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)
    """Never in a repr: settings are logged, the private key must not be."""
    ca_pem: bytes = field(repr=False)

    def server_credentials(self) -> grpc.ServerCredentials:
        """TLS with this certificate. It asks the caller for no certificate (Python's gRPC
        can only require one, and a refused handshake reaches the caller as UNAVAILABLE):
        each call proves its caller with a signed credential instead
        (``internal_credential``), checked before the handler (``caller_policy``)."""
        # The chain carries the CA certificate (public): a caller that has no copy can
        # still finish the handshake and be answered with a status, not a failed connect.
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem + self.ca_pem)])

    def channel_credentials(self, peer: str) -> grpc.ChannelCredentials:
        """Trust only the internal CA, present this service's certificate, and sign each
        call's credential for ``peer``."""
        return grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(
                root_certificates=self.ca_pem,
                private_key=self.key_pem,
                certificate_chain=self.cert_pem,
            ),
            self.signer().call_credentials(peer),
        )

    def signer(self) -> CredentialSigner:
        return CredentialSigner(self.cert_pem, self.key_pem)

    def verifier(self) -> CredentialVerifier:
        """Checks callers' credentials made for this service, against the internal CA."""
        return CredentialVerifier(self.service, self.ca_pem, IDENTITY_SUFFIX)

    @staticmethod
    def channel_options(peer: str) -> list[tuple[str, str]]:
        """Check that the server reached is ``peer`` (its certificate's name), whatever the
        address dialled (``127.0.0.1:port``, a Kubernetes Service name)."""
        return [("grpc.ssl_target_name_override", identity_name(peer))]

    def aio_channel(
        self, peer: str, target: str, options: Iterable[tuple[str, object]] = (), **kwargs: object
    ) -> grpc.aio.Channel:
        """A grpc.aio channel to ``peer`` at ``target`` (``host:port``), as this service."""
        return grpc.aio.secure_channel(
            target,
            self.channel_credentials(peer),
            options=[*options, *self.channel_options(peer)],
            **kwargs,  # type: ignore[arg-type]
        )

    def channel(self, peer: str, target: str) -> grpc.Channel:
        """The same, blocking (tests and tools)."""
        return grpc.secure_channel(
            target, self.channel_credentials(peer), options=self.channel_options(peer)
        )


@dataclass(frozen=True)
class InternalPKI:
    """The files of the internal CA and the services' certificates (see the module doc)."""

    root: Path

    @classmethod
    def of_home(cls, home: Path, environ: Mapping[str, str] | None = None) -> InternalPKI:
        """``$ORCHARD_INTERNAL_TLS_DIR`` when set, else ``<home>/secrets/internal``."""
        env = os.environ if environ is None else environ
        chosen = env.get(ENV_INTERNAL_TLS_DIR)
        return cls(Path(chosen) if chosen else home / "secrets" / "internal")

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key_file(self) -> Path:
        return self.root / "ca.key"

    def cert_file(self, service: str) -> Path:
        return self.root / f"{service}.pem"

    def key_file(self, service: str) -> Path:
        return self.root / f"{service}.key"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One issuer at a time (services of one home may start together)."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _ca(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        if not self.ca_file.exists() and not self.ca_key_file.exists():
            ca, key = make_ca(CA_NAME)
            write_file(self.ca_key_file, key_pem(key), 0o600)
            write_file(self.ca_file, cert_pem(ca), 0o644)
            return ca, key
        ca = x509.load_pem_x509_certificate(_read(self.ca_file, "CA certificate"))
        loaded = serialization.load_pem_private_key(_read(self.ca_key_file, "CA key"), None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise InternalPKIError(f"{self.ca_key_file}: not an EC key (not made by orchard)")
        return ca, loaded

    def _current(self, ca: x509.Certificate, service: str) -> bool:
        try:
            leaf = x509.load_pem_x509_certificate(self.cert_file(service).read_bytes())
        except (OSError, ValueError):
            return False
        if not self.key_file(service).exists() or leaf.issuer != ca.subject:
            return False
        try:  # issued by this CA's key, not by an older CA of the same name
            leaf.verify_directly_issued_by(ca)
        except (InvalidSignature, ValueError, TypeError):
            return False
        left = leaf.not_valid_after_utc - dt.datetime.now(dt.UTC)
        return left >= dt.timedelta(days=RENEW_BEFORE_DAYS)

    def ensure(self, services: Iterable[str] = SERVICES) -> None:
        """Make the CA if there is none and each service's certificate unless a current one
        (of this CA) is there."""
        with self._locked():
            ca, ca_key = self._ca()
            for service in services:
                if self._current(ca, service):
                    continue
                name = identity_name(service)
                leaf, leaf_key = issue(ca, ca_key, [name])
                write_file(self.key_file(service), key_pem(leaf_key), 0o600)
                write_file(self.cert_file(service), cert_pem(leaf), 0o644)

    def rotate(self, services: Iterable[str] = SERVICES) -> None:
        """A new CA and new certificates for ``services``: every old certificate stops being
        accepted once the services restart with the new files."""
        with self._locked():
            for stale in (self.ca_file, self.ca_key_file):
                stale.unlink(missing_ok=True)
        self.ensure(services)

    def identity(self, service: str, *, issue_missing: bool = True) -> ServiceIdentity:
        """``service``'s identity. With ``issue_missing``, and the CA key at hand (a machine,
        not a pod), a missing or stale certificate is issued first."""
        if issue_missing and (self.ca_key_file.exists() or not self.ca_file.exists()):
            try:
                self.ensure([service])
            except OSError as err:
                raise InternalPKIError(
                    f"cannot issue the {service}'s internal certificate in {self.root}: {err}"
                ) from None
        return ServiceIdentity(
            service,
            _read(self.cert_file(service), f"certificate of the {service}"),
            _read(self.key_file(service), f"key of the {service}"),
            _read(self.ca_file, "CA certificate"),
        )


__all__ = [
    "ENV_INTERNAL_TLS_DIR",
    "SERVICES",
    "InternalPKI",
    "InternalPKIError",
    "ServiceIdentity",
    "identity_name",
]
