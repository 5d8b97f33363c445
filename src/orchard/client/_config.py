"""Where to connect and with which key, resolved once per call site.

Order: explicit arguments, then ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY``, then
the files the embedded default (``orchard up``) writes under
``ORCHARD_HOME`` (default /var/lib/orchard): ``run/gateway.addr`` and
``dev-api-key``. ``ORCHARD_DATA_PLANE`` (``direct``, the default, or ``proxy``)
says whether exec/session/file calls go straight to the sandbox's node
executor or through the gateway (which forwards them; for clients that cannot
reach the nodes). In proxy mode those calls go to ``ORCHARD_DATA_PLANE_ENDPOINT``
when set, else to the home's ``run/data-plane.addr`` (written by ``orchard up
--data-plane-proxy nginx``) when the endpoint itself came from that home, else
to the gateway endpoint (its own Python proxy). That way a laptop user needs no set-up at all and a trainer
on a cluster sets two variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ._errors import ConfigurationError
from ._tls import TLS, resolve_endpoint

DEFAULT_HOME = Path("/var/lib/orchard")
DATA_PLANE_MODES = ("direct", "proxy")


@dataclass(frozen=True)
class ClientConfig:
    """Where a client connects and with which key, once resolved (module docstring: the order
    of arguments, environment and the home's files)."""

    endpoint: str
    """The gateway: ``grpcs://host:port`` (TLS) or ``host:port`` (plaintext); see ``_tls``."""
    api_key: str
    """Sent as ``authorization: Bearer <api_key>``."""
    data_plane: str = "direct"
    """``direct``: data-plane calls go to the node executor; ``proxy``: through the gateway."""
    data_plane_endpoint: str | None = None
    """host:port proxy-mode data-plane calls go to (an nginx proxy); None: the gateway endpoint."""
    tls: TLS | None = None
    """TLS settings (``orchard.TLS``) or None for plaintext channels; :meth:`resolve` derives it
    from the endpoint's scheme, ``tls=``, ``ORCHARD_TLS_*`` and the home's ``run/ca.pem``."""
    home: Path = field(default=DEFAULT_HOME, compare=False)
    """The node home the files above came from (the rewards endpoint is looked up there too)."""

    @property
    def proxied(self) -> bool:
        """Data-plane calls go through a proxy (``data_plane == "proxy"``)."""
        return self.data_plane == "proxy"

    @classmethod
    def resolve(
        cls,
        endpoint: str | None = None,
        api_key: str | None = None,
        environ: Mapping[str, str] | None = None,
        data_plane: str | None = None,
        tls: TLS | None = None,
        required: bool = True,
    ) -> ClientConfig:
        """``required=False`` (a client given its own transport, e.g. ``orchard.testing``'s
        fake) leaves a missing endpoint or key empty instead of raising."""
        env = os.environ if environ is None else environ
        home = Path(env.get("ORCHARD_HOME") or DEFAULT_HOME)
        from_home = not (endpoint or env.get("ORCHARD_ENDPOINT"))
        endpoint = endpoint or env.get("ORCHARD_ENDPOINT") or _read(home / "run" / "gateway.addr")
        if not endpoint and required:
            raise ConfigurationError(
                "no Orchard endpoint: pass endpoint=..., set ORCHARD_ENDPOINT, "
                f"or start the embedded default with `orchard up` (it writes {home / 'run' / 'gateway.addr'})"
            )
        api_key = api_key or env.get("ORCHARD_API_KEY") or _read(home / "dev-api-key")
        if not api_key and required:
            raise ConfigurationError(
                f"no API key: pass api_key=..., set ORCHARD_API_KEY, or make {home / 'dev-api-key'} readable"
            )
        data_plane = (data_plane or env.get("ORCHARD_DATA_PLANE") or "direct").strip().lower()
        if data_plane not in DATA_PLANE_MODES:
            raise ConfigurationError(
                f"data plane {data_plane!r}: expected one of {', '.join(DATA_PLANE_MODES)} "
                "(ORCHARD_DATA_PLANE)"
            )
        data_plane_endpoint = env.get("ORCHARD_DATA_PLANE_ENDPOINT") or (
            _read(home / "run" / "data-plane.addr") if from_home else ""
        )
        if endpoint:
            endpoint, tls = resolve_endpoint(
                endpoint, tls, environ=env, home=home if from_home else None
            )
        return cls(
            endpoint=endpoint,
            api_key=api_key,
            data_plane=data_plane,
            data_plane_endpoint=data_plane_endpoint or None,
            tls=tls,
            home=home,
        )

    def rewards_endpoint(self, explicit: str | None = None) -> str:
        """host:port of the rewards service: ``explicit``, else ``ORCHARD_REWARDS_ENDPOINT``,
        else the home's ``run/rewards.addr`` (``orchard up`` writes it)."""
        endpoint = explicit or os.environ.get("ORCHARD_REWARDS_ENDPOINT")
        if endpoint:
            return endpoint
        path = self.home / "run" / "rewards.addr"
        endpoint = _read(path)
        if not endpoint:
            raise ConfigurationError(
                "no rewards endpoint: pass rewards_endpoint=..., set ORCHARD_REWARDS_ENDPOINT, "
                f"or run `orchard up` (it writes {path})"
            )
        return endpoint


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
