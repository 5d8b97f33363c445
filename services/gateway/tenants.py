"""TenantRegistry: the node admin's view of tenants, their keys and quotas.

Tenants and their key hashes live in ``<home>/api_keys.json`` (the file
:class:`~orchard.gateway.auth.ApiKeyAuth` reads: ``{"tenant": ["<sha256>",
...]}``), quotas in ``<home>/quotas.json`` (``orchard.common.quotas``). Both
are rewritten atomically (temp file + rename, mode 0600) under an exclusive
``flock`` on ``<home>/.tenants.lock``, so two admins running ``orchard
tenant ...`` at once cannot lose each other's change, and the gateway (which
re-reads on mtime change) never sees half a file.

A plain key is returned exactly once, by :meth:`create` and :meth:`rotate_key`;
only its sha256 is stored. A revoked tenant keeps its entry with no keys (so
``ls`` still shows it and its name is not silently reused) and every call with
its old keys is UNAUTHENTICATED from the next request on.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchard.common.layout import NodeLayout
from orchard.common.quotas import QUOTA_FILE, Quota, QuotaTable
from orchard.common.tokens import Revocations

from .auth import KEY_FILE, hash_key

TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
LOCK_FILE = ".tenants.lock"


class TenantError(Exception):
    """A tenant command cannot be done (unknown or duplicate name, bad value)."""


@dataclass(frozen=True)
class TenantInfo:
    name: str
    keys: int
    quota: Quota

    @property
    def revoked(self) -> bool:
        return self.keys == 0


def new_api_key() -> str:
    """A random API key (256 bits): a fast hash suffices to store it."""
    return "ork_" + secrets.token_urlsafe(32)


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_tenant_name(name: str) -> str:
    if not TENANT_RE.fullmatch(name):
        raise TenantError(
            f"invalid tenant name {name[:80]!r}: 1-64 of letters, digits, '.', '_', '-',"
            " starting with a letter or digit"
        )
    return name


class TenantRegistry:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.keys_path = home / KEY_FILE
        self.quotas_path = home / QUOTA_FILE

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.home.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.home / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _keys(self) -> dict[str, list[str]]:
        try:
            data = json.loads(self.keys_path.read_text())
        except FileNotFoundError:
            return {}
        if not isinstance(data, dict):
            raise TenantError(f"{self.keys_path} is not a JSON object")
        return {str(k): [str(h) for h in v] for k, v in data.items()}

    def _save_keys(self, keys: dict[str, list[str]]) -> None:
        _write_private(self.keys_path, json.dumps(keys, indent=2, sort_keys=True) + "\n")

    def _quotas(self) -> QuotaTable:
        try:
            return QuotaTable.parse(self.quotas_path.read_text())
        except FileNotFoundError:
            return QuotaTable(Quota(), {})

    # ---- commands -------------------------------------------------------------

    def list(self) -> list[TenantInfo]:
        keys, quotas = self._keys(), self._quotas()
        return [
            TenantInfo(name, len(hashes), quotas.for_tenant(name))
            for name, hashes in sorted(keys.items())
        ]

    def create(self, name: str) -> str:
        """Make tenant ``name`` with one new key; returns the plain key (shown once)."""
        check_tenant_name(name)
        with self._locked():
            keys = self._keys()
            if name in keys:
                raise TenantError(f"tenant {name!r} already exists (rotate-key makes a new key)")
            key = new_api_key()
            keys[name] = [hash_key(key)]
            self._save_keys(keys)
        return key

    def revoke(self, name: str) -> None:
        """Drop every key of ``name``: its calls fail UNAUTHENTICATED from now on, and the
        data-plane tokens it was given stop working (``revocations.json``)."""
        with self._locked():
            keys = self._keys()
            if name not in keys:
                raise TenantError(f"no tenant {name!r}")
            keys[name] = []
            self._save_keys(keys)
            Revocations.revoke(NodeLayout(self.home).revocations, name)

    def rotate_key(self, name: str, keep_old: bool = False) -> str:
        """A new key for ``name`` (the old ones stop working unless ``keep_old``)."""
        with self._locked():
            keys = self._keys()
            if name not in keys:
                raise TenantError(f"no tenant {name!r}")
            key = new_api_key()
            keys[name] = [*(keys[name] if keep_old else []), hash_key(key)]
            self._save_keys(keys)
            if not keep_old:
                # The old key's data-plane tokens go with it (new ones come with the new key).
                Revocations.revoke(NodeLayout(self.home).revocations, name)
        return key

    def set_quota(self, name: str, values: dict[str, str]) -> Quota:
        """Set quota fields of ``name`` (or of every tenant for ``name == "default"``)."""
        with self._locked():
            table = self._quotas()
            try:
                if name == "default":
                    new_default = Quota.from_mapping(
                        {**table.default.to_mapping(), **values}, "default"
                    )
                    table = QuotaTable(new_default, table.tenants)
                    quota = new_default
                else:
                    if name not in self._keys():
                        raise TenantError(f"no tenant {name!r}")
                    base = table.for_tenant(name)
                    current = {**base.to_mapping(), **values}
                    quota = Quota.from_mapping(current, f"tenants.{name}")
                    table = QuotaTable(table.default, {**table.tenants, name: quota})
            except ValueError as exc:
                raise TenantError(str(exc)) from None
            _write_private(self.quotas_path, table.to_json())
        return quota
