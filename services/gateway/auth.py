"""ApiKeyAuth: API keys -> tenants, keys stored only as sha256 hashes.

The key file is ``<home>/api_keys.json``: ``{"tenant": ["<sha256 hex>", ...]}``.
On first start with no key file, the embedded default makes one tenant ``dev``
with a random key written to ``<home>/dev-api-key`` (mode 0600) so a local user
can start working at once; the plaintext exists nowhere else.

The file is re-read when its mtime changes, so adding a key needs no restart.
Keys are random (>= 32 bytes of entropy), so a fast hash is enough: a sha256
lookup in a dict, no per-request KDF.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

from orchard.common.errors import ServiceError, unauthenticated

DEV_TENANT = "dev"
KEY_FILE = "api_keys.json"
DEV_KEY_FILE = "dev-api-key"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def ensure_dev_key(home: Path) -> Path | None:
    """Create the dev tenant and its key if there is no key file yet; returns the key file."""
    keys_path = home / KEY_FILE
    dev_path = home / DEV_KEY_FILE
    if keys_path.exists():
        return dev_path if dev_path.exists() else None
    home.mkdir(parents=True, exist_ok=True)
    key = "ork_" + secrets.token_urlsafe(32)
    _write_private(dev_path, key + "\n")
    _write_private(keys_path, json.dumps({DEV_TENANT: [hash_key(key)]}, indent=2) + "\n")
    return dev_path


class ApiKeyAuth:
    def __init__(self, keys_path: Path) -> None:
        self.keys_path = keys_path
        self._mtime_ns = -1
        self._tenants_by_hash: dict[str, str] = {}

    def _reload_if_changed(self) -> None:
        try:
            mtime = self.keys_path.stat().st_mtime_ns
        except FileNotFoundError:
            self._tenants_by_hash, self._mtime_ns = {}, -1
            return
        if mtime == self._mtime_ns:
            return
        data = json.loads(self.keys_path.read_text())
        table: dict[str, str] = {}
        for tenant, hashes in dict(data).items():
            for h in hashes:
                table[str(h).lower()] = str(tenant)
        self._tenants_by_hash, self._mtime_ns = table, mtime

    def tenant_for(self, authorization: str | None) -> str:
        """The tenant whose key is in ``authorization`` ("Bearer <key>"), else UNAUTHENTICATED."""
        if not authorization:
            raise _denied("missing API key: send 'authorization: Bearer <key>'")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise _denied("malformed authorization metadata: expected 'Bearer <key>'")
        self._reload_if_changed()
        tenant = self._tenants_by_hash.get(hash_key(key.strip()))
        if tenant is None:
            raise _denied("invalid API key")
        return tenant


def _denied(message: str) -> ServiceError:
    return unauthenticated(message, "API_KEY_INVALID")
