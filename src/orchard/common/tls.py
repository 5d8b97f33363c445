"""Server-side TLS: one certificate, its key and an optional client CA, shared by every service.

Each service's settings dataclass holds a :class:`ServerTLS` (or None: plaintext), read
from its ``--tls-cert`` / ``--tls-key`` / ``--tls-client-ca`` flags or, when a flag is
absent, from ``ORCHARD_TLS_CERT`` / ``ORCHARD_TLS_KEY`` / ``ORCHARD_TLS_CLIENT_CA``
(``tls_args.add_tls_arguments``, :func:`tls_from_arguments`). From it come the gRPC
server credentials (:meth:`ServerTLS.grpc_credentials`) and, for the gateway's REST
front (aiohttp), an :class:`ssl.SSLContext` (:meth:`ServerTLS.ssl_context`).

- The files are read once, when the settings are built, and checked together: a
  key that does not match its certificate, a missing file or a file that is no PEM
  is a :class:`TLSConfigError` naming the file, before anything listens (grpc's own
  report would be a bare "could not bind").
- ``client_ca_file`` turns on mutual TLS: a client must present a certificate that
  CA issued, or the handshake fails.
- A renewed certificate (cert-manager rewrites the Secret) is picked up at the
  service's next start; nothing here watches the files.

:func:`add_port` is the one place a server binds: a secure port with credentials,
a plain one without (``unix:`` sockets always plain: the socket's file mode is the
boundary there, TLS would add nothing).
"""

from __future__ import annotations

import argparse
import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from .tls_args import ENV_CERT, ENV_CLIENT_CA, ENV_KEY, add_tls_arguments, tls_paths

SECURE_SCHEME = "grpcs://"
PLAIN_SCHEME = "grpc://"


class TLSConfigError(ValueError):
    """TLS settings that cannot work: a missing or unreadable file, a key that does not
    match its certificate, a certificate without its key."""


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TLSConfigError(f"TLS {what} {path}: {err.strerror or err}") from None
    if b"-----BEGIN " not in data:
        raise TLSConfigError(f"TLS {what} {path}: not a PEM file")
    return data


@dataclass(frozen=True)
class ServerTLS:
    """A server's certificate chain, private key and (for mTLS) the CA its clients' certificates
    must come from. Build with :meth:`load` so the files are read and checked once."""

    cert_file: Path
    """PEM certificate chain, leaf first (cert-manager's ``tls.crt``); valid for every name
    and address clients dial (its subjectAltNames)."""
    key_file: Path
    """PEM private key of the leaf (``tls.key``)."""
    client_ca_file: Path | None = None
    """PEM CA bundle; set, every client must present a certificate it issued (mutual TLS)."""
    cert_pem: bytes = field(default=b"", repr=False)
    key_pem: bytes = field(default=b"", repr=False)
    """Never in a repr: settings are logged, the private key must not be."""
    client_ca_pem: bytes | None = field(default=None, repr=False)

    @classmethod
    def load(cls, cert_file: Path, key_file: Path, client_ca_file: Path | None = None) -> ServerTLS:
        cert_pem = _read(cert_file, "certificate")
        key_pem = _read(key_file, "key")
        client_ca_pem = _read(client_ca_file, "client CA") if client_ca_file else None
        tls = cls(cert_file, key_file, client_ca_file, cert_pem, key_pem, client_ca_pem)
        tls.ssl_context()  # OpenSSL checks the pair (and the CA) now, with a clear message
        return tls

    @property
    def mutual(self) -> bool:
        return self.client_ca_pem is not None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.client_ca_pem,
            require_client_auth=self.mutual,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The same certificate for an asyncio/aiohttp server (TLS 1.2 or newer)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as err:
            raise TLSConfigError(
                f"TLS certificate {self.cert_file} and key {self.key_file} do not load "
                f"together: {err}"
            ) from None
        if self.client_ca_pem is not None:
            try:
                context.load_verify_locations(cadata=self.client_ca_pem.decode("ascii"))
            except (ssl.SSLError, UnicodeDecodeError) as err:
                raise TLSConfigError(f"TLS client CA {self.client_ca_file}: {err}") from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def server_tls(
    cert: Path | str | None,
    key: Path | str | None,
    client_ca: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
) -> ServerTLS | None:
    """TLS settings from explicit paths, each falling back to its environment variable;
    None when neither a certificate nor a key is named (plaintext). Half a pair, or a
    client CA without a certificate, is a TLSConfigError: never a silent plaintext."""
    env = os.environ if environ is None else environ
    cert = cert or env.get(ENV_CERT) or None
    key = key or env.get(ENV_KEY) or None
    client_ca = client_ca or env.get(ENV_CLIENT_CA) or None
    if cert is None and key is None:
        if client_ca is not None:
            raise TLSConfigError(
                f"a client CA ({ENV_CLIENT_CA} / --tls-client-ca) needs a server certificate "
                f"and key ({ENV_CERT}, {ENV_KEY})"
            )
        return None
    if cert is None or key is None:
        missing = "certificate (--tls-cert, ORCHARD_TLS_CERT)" if cert is None else "key"
        raise TLSConfigError(f"TLS needs both a certificate and a key; the {missing} is missing")
    return ServerTLS.load(Path(cert), Path(key), Path(client_ca) if client_ca else None)


def tls_from_arguments(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> ServerTLS | None:
    """The TLS settings :func:`add_tls_arguments` parsed; a bad set is a usage error."""
    try:
        return server_tls(*tls_paths(args))
    except TLSConfigError as err:
        parser.error(str(err))


def server_credentials(tls: ServerTLS | None, listen: str) -> grpc.ServerCredentials | None:
    """What ``run_service(server_credentials=...)`` takes: None for plaintext and for
    ``unix:`` sockets."""
    if tls is None or listen.startswith("unix:"):
        return None
    return tls.grpc_credentials()


def add_port(server: grpc.aio.Server, listen: str, tls: ServerTLS | None) -> int:
    """Bind ``listen`` on ``server``: a TLS port when ``tls`` is set (and ``listen`` is not a
    Unix socket), a plaintext one otherwise. Returns the bound port (0 = failed)."""
    credentials = server_credentials(tls, listen)
    if credentials is None:
        return server.add_insecure_port(listen)
    return server.add_secure_port(listen, credentials)


def upstream_credentials(
    ca_file: Path | None, client: ServerTLS | None = None
) -> grpc.ChannelCredentials:
    """Channel credentials for a service calling a TLS peer (the gateway -> an executor):
    trust ``ca_file`` (None: the system's roots) and, when the service has a certificate,
    present it, so a peer that asks for client certificates (mTLS) gets one."""
    root = _read(ca_file, "CA") if ca_file is not None else None
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.ssl_channel_credentials(
        root_certificates=root, private_key=client.key_pem, certificate_chain=client.cert_pem
    )


def scheme_address(address: str, tls: bool) -> str:
    """``address`` as an endpoint that says whether it speaks TLS (``grpcs://`` when it does),
    the form the SDK parses and ``run/*.addr`` files hold."""
    return f"{SECURE_SCHEME}{address}" if tls else address


def aio_channel(
    endpoint: str,
    credentials: grpc.ChannelCredentials | None = None,
    *,
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[Any] | None = None,
) -> grpc.aio.Channel:
    """A grpc.aio channel to a service's peer: ``grpcs://host:port`` with TLS (``credentials``,
    or the system's roots when None), a bare ``host:port`` / ``grpc://`` / ``unix:`` plain."""
    if endpoint.startswith(SECURE_SCHEME):
        return grpc.aio.secure_channel(
            endpoint[len(SECURE_SCHEME) :],
            credentials or grpc.ssl_channel_credentials(),
            options=list(options),
            interceptors=interceptors,
        )
    target = endpoint.removeprefix(PLAIN_SCHEME)
    return grpc.aio.insecure_channel(target, options=list(options), interceptors=interceptors)


__all__ = [
    "ENV_CERT",
    "ENV_CLIENT_CA",
    "ENV_KEY",
    "ServerTLS",
    "TLSConfigError",
    "add_port",
    "add_tls_arguments",
    "aio_channel",
    "scheme_address",
    "server_credentials",
    "server_tls",
    "tls_from_arguments",
    "upstream_credentials",
]
