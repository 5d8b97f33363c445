"""Where to connect and with which key, resolved once per call site.

Order: explicit arguments, then ``ORCHARD_ENDPOINT`` / ``ORCHARD_API_KEY``, then
the files the embedded default (``orchard up``) writes under
``ORCHARD_HOME`` (default /var/lib/orchard): ``run/gateway.addr`` and
``dev-api-key``. That way a laptop user needs no set-up at all and a trainer
on a cluster sets two variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ._errors import ConfigurationError

DEFAULT_HOME = Path("/var/lib/orchard")


@dataclass(frozen=True)
class ClientConfig:
    endpoint: str
    """host:port of the gateway."""
    api_key: str
    """Sent as ``authorization: Bearer <api_key>``."""

    @classmethod
    def resolve(
        cls,
        endpoint: str | None = None,
        api_key: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ClientConfig:
        env = os.environ if environ is None else environ
        home = Path(env.get("ORCHARD_HOME") or DEFAULT_HOME)
        endpoint = endpoint or env.get("ORCHARD_ENDPOINT") or _read(home / "run" / "gateway.addr")
        if not endpoint:
            raise ConfigurationError(
                "no Orchard endpoint: pass endpoint=..., set ORCHARD_ENDPOINT, "
                f"or start the embedded default with `orchard up` (it writes {home / 'run' / 'gateway.addr'})"
            )
        api_key = api_key or env.get("ORCHARD_API_KEY") or _read(home / "dev-api-key")
        if not api_key:
            raise ConfigurationError(
                f"no API key: pass api_key=..., set ORCHARD_API_KEY, or make {home / 'dev-api-key'} readable"
            )
        return cls(endpoint=endpoint, api_key=api_key)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
