"""A signed per-call credential that proves an internal caller's identity (the scheduler's callers).

Why not the TLS handshake alone: Python's gRPC can only *require* a client certificate
(``require_client_auth=True``) or *not ask* for one; it has no "request and verify if
given". Requiring it made a caller without one fail in the handshake, which its gRPC
reports as UNAVAILABLE ("failed to connect"), indistinguishable from a service that is
down. So the server's TLS asks for no client certificate, and each call carries
``orchard-internal-identity`` metadata instead, which proves the same thing: the caller
holds the private key of a certificate the internal CA issued. A call without it, or
with one that does not verify, is refused with UNAUTHENTICATED and a message naming
what is missing (``caller_policy``); a verified service that may not call the RPC gets
PERMISSION_DENIED.

The value: ``v1.<certificate DER, base64url>.<audience>.<issued, unix s>.<signature>``,
the signature (SHA-256; ECDSA, RSA PKCS#1 v1.5 or Ed25519) by the certificate's key over
``orchard-internal-identity-v1\\0<audience>\\0<issued>``. ``audience`` is the service
called (the scheduler refuses a credential made for another one), ``issued`` bounds it
to :data:`VALID_SECONDS` (a caller re-signs every :data:`RESIGN_SECONDS`). It travels
only inside the server-authenticated TLS channel (the client pins the server's internal
name), so it cannot be read on the way; the one party that sees it is the server it was
made for. Signing and verifying are the ``cryptography`` package's; a verified value is
remembered until it expires, so a call costs a dict lookup.
"""

from __future__ import annotations

import base64
import datetime as dt
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

HEADER = "orchard-internal-identity"
VERSION = "v1"
VALID_SECONDS = 120.0
"""How long a credential is accepted after it was signed (either side of the server's clock)."""
RESIGN_SECONDS = 30.0
MAX_CHARS = 8192
MAX_REMEMBERED = 1024
_CONTEXT = b"orchard-internal-identity-v1\0"


class CredentialError(Exception):
    """The credential is malformed, not the internal CA's, expired, or for another service."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signed_text(audience: str, issued: int) -> bytes:
    return _CONTEXT + audience.encode() + b"\0" + str(issued).encode()


SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
"""orchard up issues EC keys; the chart's Helm ``genPrivateKey`` may make RSA ones."""


def _sign(key: SigningKey, data: bytes) -> bytes:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(data, ec.ECDSA(hashes.SHA256()))
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    return key.sign(data)


def _verify(cert: x509.Certificate, signature: bytes, data: bytes) -> None:
    """InvalidSignature unless ``signature`` over ``data`` is by ``cert``'s key."""
    public = cert.public_key()
    if isinstance(public, ec.EllipticCurvePublicKey):
        public.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    elif isinstance(public, rsa.RSAPublicKey):
        public.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
    elif isinstance(public, ed25519.Ed25519PublicKey):
        public.verify(signature, data)
    else:
        raise InvalidSignature


@dataclass
class CredentialSigner:
    """Makes (and re-makes every RESIGN_SECONDS) one caller's credential per audience."""

    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)
    clock: Callable[[], float] = time.time
    _cert_b64: str = field(init=False, repr=False)
    _key: SigningKey = field(init=False, repr=False)
    _made: dict[str, tuple[float, str]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        cert = x509.load_pem_x509_certificate(self.cert_pem)
        self._cert_b64 = _b64(cert.public_bytes(serialization.Encoding.DER))
        key = serialization.load_pem_private_key(self.key_pem, None)
        if not isinstance(
            key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
        ):
            raise ValueError("internal identity keys are EC, RSA or Ed25519 keys")
        self._key = key

    def credential(self, audience: str) -> str:
        now = self.clock()
        with self._lock:
            made = self._made.get(audience)
            if made is not None and now - made[0] < RESIGN_SECONDS:
                return made[1]
            issued = int(now)
            signature = _sign(self._key, _signed_text(audience, issued))
            value = f"{VERSION}.{self._cert_b64}.{audience}.{issued}.{_b64(signature)}"
            self._made[audience] = (now, value)
            return value

    def call_credentials(self, audience: str) -> grpc.CallCredentials:
        """gRPC call credentials adding the credential for ``audience`` to every call."""
        signer = self

        class _Plugin(grpc.AuthMetadataPlugin):
            def __call__(
                self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
            ) -> None:
                try:
                    callback(((HEADER, signer.credential(audience)),), None)
                except Exception as err:  # the plugin must answer the callback, whatever failed
                    callback((), err)

        return grpc.metadata_call_credentials(_Plugin(), name="orchard-internal-identity")


def credential_of(metadata: Iterable[Any] | None) -> str | None:
    for key, value in metadata or ():
        if key == HEADER:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


@dataclass
class CredentialVerifier:
    """Checks credentials made for ``audience`` against the internal CA ``ca_pem``."""

    audience: str
    ca_pem: bytes = field(repr=False)
    suffix: str = ".orchard.internal"
    clock: Callable[[], float] = time.time
    _ca: x509.Certificate = field(init=False, repr=False)
    _verified: dict[str, tuple[float, str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._ca = x509.load_pem_x509_certificate(self.ca_pem)

    def caller(self, value: str) -> str:
        """The service the credential proves (its certificate's name without the suffix);
        CredentialError (its message says why) otherwise."""
        now = self.clock()
        known = self._verified.get(value)
        if known is not None:
            if known[0] >= now:
                return known[1]
            del self._verified[value]
        if len(value) > MAX_CHARS or not value.isascii():
            raise CredentialError("malformed credential")
        parts = value.split(".")
        if len(parts) != 5 or parts[0] != VERSION:
            raise CredentialError("malformed credential")
        _, cert_b64, audience, issued_text, signature_b64 = parts
        if audience != self.audience:
            raise CredentialError(f"the credential is for the {audience[:40]!r}, not this service")
        if not issued_text.isascii() or not issued_text.isdigit():
            raise CredentialError("malformed credential")
        issued = int(issued_text)
        if abs(now - issued) > VALID_SECONDS:
            raise CredentialError(
                f"the credential was signed {now - issued:.0f} s from now (valid "
                f"{VALID_SECONDS:.0f} s): the caller's clock or a replay"
            )
        try:
            cert = x509.load_der_x509_certificate(_unb64(cert_b64))
            signature = _unb64(signature_b64)
        except ValueError:
            raise CredentialError("malformed credential") from None
        service = self._check_certificate(cert, now)
        try:
            _verify(cert, signature, _signed_text(audience, issued))
        except InvalidSignature:
            raise CredentialError("the signature does not match the certificate") from None
        if len(self._verified) >= MAX_REMEMBERED:
            self._verified.clear()
        self._verified[value] = (issued + VALID_SECONDS, service)
        return service

    def _check_certificate(self, cert: x509.Certificate, now: float) -> str:
        try:
            if cert.issuer != self._ca.subject:
                raise InvalidSignature
            cert.verify_directly_issued_by(self._ca)
        except (InvalidSignature, ValueError, TypeError):
            raise CredentialError(
                "the certificate was not issued by this deployment's internal CA"
            ) from None
        moment = dt.datetime.fromtimestamp(now, dt.UTC)
        if not cert.not_valid_before_utc <= moment <= cert.not_valid_after_utc:
            raise CredentialError("the certificate has expired or is not valid yet")
        names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        name = str(names[0].value) if len(names) == 1 else ""
        if not name.endswith(self.suffix) or name == self.suffix:
            raise CredentialError("the certificate names no internal service")
        return name[: -len(self.suffix)]


__all__ = [
    "HEADER",
    "CredentialError",
    "CredentialSigner",
    "CredentialVerifier",
    "credential_of",
]
