"""TLS for the SDK's channels: endpoints that say whether they are secure, and the credentials.

**Endpoints.** ``grpcs://host:port`` is TLS; ``grpc://host:port`` and a bare
``host:port`` are plaintext; ``unix:/path`` is a local socket (always plaintext);
``https://`` / ``http://`` are the REST front's. :func:`parse_endpoint` splits one
into a :class:`Endpoint` (the target grpc dials and whether TLS is on). Anything
else (``ftp://``, a missing port, a path after the port) is a ConfigurationError:
no guessing, and never plaintext where the user wrote a secure scheme.

**Credentials.** :class:`TLS` names what to trust and, for mutual TLS, what to
present: ``ca`` (a PEM file path or the PEM bytes; None = the system's roots),
``cert`` / ``key`` (a client certificate, both or neither) and ``server_name``
(the name to check the server's certificate against when it differs from the
host dialled, e.g. a pod IP behind a certificate for a service name).
:meth:`TLS.channel_credentials` reads the files when called.

**Resolution** (:func:`resolve_tls`), for a secure endpoint: an explicit ``tls=``;
else ``ORCHARD_TLS_CA`` / ``ORCHARD_TLS_CERT`` / ``ORCHARD_TLS_KEY``; else, when the
endpoint itself came from the home (``run/gateway.addr``), the CA ``orchard up
--tls`` wrote to ``<home>/run/ca.pem``; else the system's roots. An explicit
``tls=`` with a plaintext endpoint is refused (a client asked for TLS and would not
get it). ``ORCHARD_TLS_CERT`` / ``ORCHARD_TLS_KEY`` are also the variables a
service reads for its own server certificate: an SDK inside a service's process
(the rewards service) would present that certificate as its client certificate,
which a server without mTLS ignores.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ._errors import ConfigurationError

ENV_CA = "ORCHARD_TLS_CA"
ENV_CERT = "ORCHARD_TLS_CERT"
ENV_KEY = "ORCHARD_TLS_KEY"
HOME_CA = Path("run") / "ca.pem"
"""Where ``orchard up --tls`` leaves the CA clients trust, relative to the home."""

PemSource = str | os.PathLike[str] | bytes
"""A PEM file's path, or the PEM itself as bytes."""

_SCHEMES = {"grpcs": True, "grpc": False, "https": True, "http": False}
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})$")


@dataclass(frozen=True)
class Endpoint:
    """A parsed endpoint: what grpc (or an HTTP client) dials, and whether TLS is on."""

    target: str
    """``host:port`` (or ``unix:/path``), without the scheme."""
    tls: bool
    scheme: str
    """The scheme as written (``grpc`` for a bare ``host:port``, ``unix`` for a socket)."""

    @property
    def host(self) -> str:
        return self.target.rpartition(":")[0].strip("[]") if self.scheme != "unix" else ""

    def __str__(self) -> str:
        if self.scheme == "unix":
            return self.target
        return (
            f"{self.scheme}://{self.target}" if self.tls or self.scheme != "grpc" else self.target
        )


def parse_endpoint(endpoint: str, *, rest: bool = False) -> Endpoint:
    """``endpoint`` split into target and TLS (module docstring); ConfigurationError when it
    is not one. ``rest=True`` takes ``https://`` / ``http://`` (the REST front) and refuses
    the gRPC schemes, and the other way round."""
    text = endpoint.strip()
    if text.startswith("unix:") and not rest:
        if len(text) <= len("unix:"):
            raise ConfigurationError(f"endpoint {endpoint!r}: a unix: endpoint needs a path")
        return Endpoint(text, False, "unix")
    scheme, sep, rest_of = text.partition("://")
    if not sep:
        scheme, rest_of = ("http" if rest else "grpc"), text
    scheme = scheme.lower()
    allowed = ("https", "http") if rest else ("grpcs", "grpc")
    if scheme not in allowed:
        raise ConfigurationError(
            f"endpoint {endpoint!r}: scheme {scheme!r} is not one of "
            f"{', '.join(s + '://' for s in allowed)} (or a bare host:port)"
        )
    rest_of = rest_of.rstrip("/")
    match = _HOST_PORT.fullmatch(rest_of)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ConfigurationError(f"endpoint {endpoint!r}: expected [{scheme}://]host:port")
    return Endpoint(rest_of, _SCHEMES[scheme], scheme)


def _pem(source: PemSource | None, what: str) -> bytes | None:
    if source is None:
        return None
    if isinstance(source, bytes):
        data = source
        where = "the given bytes"
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as err:
            raise ConfigurationError(f"TLS {what} {source}: {err.strerror or err}") from None
        where = str(source)
    if b"-----BEGIN " not in data:
        raise ConfigurationError(f"TLS {what} ({where}): not PEM")
    return data


@dataclass(frozen=True)
class TLS:
    """What a TLS client trusts and presents (module docstring)."""

    ca: PemSource | None = None
    """The CA(s) to trust: a PEM file or PEM bytes; None = the system's roots."""
    cert: PemSource | None = None
    """A client certificate chain for mutual TLS (with ``key``)."""
    key: PemSource | None = field(default=None, repr=False)
    """The client certificate's private key (kept out of the repr: it may be the PEM itself)."""
    server_name: str | None = None
    """Check the server's certificate against this name instead of the host dialled."""

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ConfigurationError(
                "TLS: a client certificate needs its key and a key its certificate "
                f"(cert={self.cert!r}, key={'set' if self.key is not None else None})"
            )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.ca, "CA"),
            private_key=_pem(self.key, "key"),
            certificate_chain=_pem(self.cert, "certificate"),
        )

    def channel_options(self) -> list[tuple[str, str]]:
        """grpc channel options this TLS needs (the server name override)."""
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TLS | None:
        """``ORCHARD_TLS_CA`` / ``ORCHARD_TLS_CERT`` / ``ORCHARD_TLS_KEY``; None when none is set."""
        env = os.environ if environ is None else environ
        ca, cert, key = (env.get(name) or None for name in (ENV_CA, ENV_CERT, ENV_KEY))
        if ca is None and cert is None and key is None:
            return None
        return cls(ca=ca, cert=cert, key=key)


def resolve_tls(
    endpoint: Endpoint,
    tls: TLS | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> TLS | None:
    """The TLS a channel to ``endpoint`` uses (None: plaintext), in the module docstring's
    order. ``home`` is the home the endpoint was read from (None: it was given)."""
    if not endpoint.tls:
        if tls is not None:
            raise ConfigurationError(
                f"tls= was given but endpoint {endpoint.target!r} is plaintext: "
                f"write grpcs://{endpoint.target} (or drop tls=)"
            )
        return None
    if tls is not None:
        return tls
    from_env = TLS.from_env(environ)
    if from_env is not None:
        return from_env
    if home is not None and (home / HOME_CA).is_file():
        return TLS(ca=home / HOME_CA)
    return TLS()


def resolve_endpoint(
    endpoint: str,
    tls: TLS | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> tuple[str, TLS | None]:
    """A client's endpoint as the transport is given it (``grpcs://host:port`` when TLS is on,
    a bare ``host:port`` or ``unix:`` path when not) and its TLS settings. An explicit ``tls=``
    turns TLS on for a bare ``host:port``; with ``grpc://`` written out it is a contradiction
    (ConfigurationError)."""
    parsed = parse_endpoint(endpoint)
    if tls is not None and not parsed.tls and "://" not in endpoint and parsed.scheme != "unix":
        parsed = Endpoint(parsed.target, True, "grpcs")
    return str(parsed), resolve_tls(parsed, tls, environ=environ, home=home)


def with_scheme(address: str, tls: bool) -> str:
    """A data-plane address (``ExecutorAccess.address``) as the transport is given it."""
    return f"grpcs://{address}" if tls else address


def split_address(address: str) -> tuple[str, bool]:
    """What a transport dials for ``address`` and whether with TLS: ``grpcs://`` is TLS,
    ``grpc://``, a bare ``host:port`` and ``unix:`` are not."""
    if address.startswith("grpcs://"):
        return address[len("grpcs://") :], True
    return address.removeprefix("grpc://"), False


def secure_channel(
    endpoint: Endpoint, tls: TLS, options: list[tuple[str, object]] | None = None
) -> grpc.Channel:
    """A sync channel to a TLS ``endpoint``."""
    return grpc.secure_channel(
        endpoint.target,
        tls.channel_credentials(),
        options=[*(options or []), *tls.channel_options()],
    )


__all__ = [
    "TLS",
    "Endpoint",
    "PemSource",
    "parse_endpoint",
    "resolve_endpoint",
    "resolve_tls",
    "secure_channel",
    "split_address",
    "with_scheme",
]
