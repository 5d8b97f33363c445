"""Per-tenant quotas: what they are, where they are configured, how they travel.

The node keeps them in ``<home>/quotas.json`` (written by ``orchard tenant
quota``, re-read when its mtime changes, so no restart is needed)::

    {"default": {"max_sandboxes": 100},
     "tenants": {"team-a": {"max_sandboxes": 10, "max_cpu_millis": 8000,
                            "create_rate": 5, "create_burst": 10, "max_execs": 64}}}

A tenant's quota is the built-in default (everything unlimited, so the
embedded default behaves as before) overlaid by ``default`` and then by the
tenant's own entry. Zero means unlimited.

Who enforces what, and why there:

- the gateway: ``create_rate``/``create_burst`` (a token bucket per tenant), and
  fair admission of creates (it sees every tenant's calls first);
- the scheduler: ``max_sandboxes``, ``max_cpu_millis``, ``max_memory_bytes``
  (it owns the sandbox state, so its check and the insert are one step);
- the executor: ``max_execs`` (only it sees execs; it learns the value from the
  signed data-plane token, see ``tokens``).

The gateway owns the file and passes the quota to the scheduler in the
``orchard-quota`` metadata (:meth:`Quota.to_metadata`), next to
``orchard-tenant``: the scheduler trusts both because only the gateway reaches it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

QUOTA_KEY = "orchard-quota"
QUOTA_FILE = "quotas.json"


class QuotaConfigError(ValueError):
    """quotas.json (or a quota in metadata) is not valid."""


@dataclass(frozen=True)
class Quota:
    """One tenant's limits; 0 means unlimited."""

    max_sandboxes: int = 0
    """Live sandboxes (pending, ready, deleting, failed) at once."""
    max_cpu_millis: int = 0
    """Sum of the live sandboxes' cpu (1000 = one core)."""
    max_memory_bytes: int = 0
    """Sum of the live sandboxes' memory limits."""
    create_rate: float = 0.0
    """Creates per second, refilled continuously (the token bucket's rate)."""
    create_burst: int = 0
    """How many creates may come at once (the bucket's size); 0 = max(1, rate)."""
    max_execs: int = 0
    """Commands (exec, run, session commands) running at once, per node."""

    @classmethod
    def from_mapping(cls, data: Any, where: str = "quota") -> Quota:
        return _overlay(cls(), data, where)

    def to_mapping(self) -> dict[str, float | int]:
        return {k: v for k, v in asdict(self).items() if v}

    def to_metadata(self) -> str:
        """Compact ``key=value,...`` form for the ``orchard-quota`` metadata."""
        return ",".join(f"{k}={v}" for k, v in self.to_mapping().items())

    @classmethod
    def from_metadata(cls, text: str) -> Quota:
        values: dict[str, str] = {}
        for item in filter(None, text.split(",")):
            key, sep, value = item.partition("=")
            if not sep:
                raise QuotaConfigError(f"malformed {QUOTA_KEY} entry {item[:40]!r}")
            values[key] = value
        return _overlay(cls(), values, QUOTA_KEY)


_TYPES = {f.name: (float if f.name == "create_rate" else int) for f in fields(Quota)}


def _overlay(base: Quota, data: Any, where: str) -> Quota:
    if not isinstance(data, dict):
        raise QuotaConfigError(f"{where}: expected an object")
    changes: dict[str, Any] = {}
    for key, raw in data.items():
        kind = _TYPES.get(str(key))
        if kind is None:
            raise QuotaConfigError(f"{where}: unknown quota {key!r} (known: {', '.join(_TYPES)})")
        try:
            value = kind(raw)
        except (TypeError, ValueError):
            raise QuotaConfigError(f"{where}.{key}: {raw!r} is not a number") from None
        if isinstance(raw, bool) or value < 0 or value != value or value == float("inf"):
            raise QuotaConfigError(f"{where}.{key}: must be a finite number >= 0")
        changes[str(key)] = value
    return replace(base, **changes)


@dataclass(frozen=True)
class QuotaTable:
    default: Quota
    tenants: dict[str, Quota]

    def for_tenant(self, tenant: str) -> Quota:
        return self.tenants.get(tenant, self.default)

    @classmethod
    def parse(cls, text: str) -> QuotaTable:
        try:
            data = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            raise QuotaConfigError(f"{QUOTA_FILE}: {exc}") from None
        if not isinstance(data, dict):
            raise QuotaConfigError(f"{QUOTA_FILE}: expected an object")
        unknown = set(data) - {"default", "tenants"}
        if unknown:
            raise QuotaConfigError(f"{QUOTA_FILE}: unknown keys {sorted(unknown)}")
        default = _overlay(Quota(), data.get("default", {}), "default")
        tenants_data = data.get("tenants", {})
        if not isinstance(tenants_data, dict):
            raise QuotaConfigError(f"{QUOTA_FILE}: 'tenants' must be an object")
        tenants = {
            str(name): _overlay(default, entry, f"tenants.{name}")
            for name, entry in tenants_data.items()
        }
        return cls(default, tenants)

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "default": self.default.to_mapping(),
                    "tenants": {
                        name: _difference(self.default, q)
                        for name, q in sorted(self.tenants.items())
                    },
                },
                indent=2,
            )
            + "\n"
        )


def _difference(base: Quota, quota: Quota) -> dict[str, float | int]:
    b, q = asdict(base), asdict(quota)
    return {k: v for k, v in q.items() if v != b[k]}


class QuotaFile:
    """``<home>/quotas.json``, re-read when it changes; a broken file keeps the last good table."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature: tuple[int, int] | None = None
        self._table = QuotaTable(Quota(), {})
        self.error = ""

    def table(self) -> QuotaTable:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._signature, self._table = None, QuotaTable(Quota(), {})
            return self._table
        signature = (st.st_mtime_ns, st.st_size)
        if signature != self._signature:
            self._signature = signature
            try:
                self._table = QuotaTable.parse(self.path.read_text())
                self.error = ""
            except (QuotaConfigError, OSError) as exc:
                # A hand-broken file must not lift every limit: keep the last
                # good table; ``error`` says why (the gateway logs it).
                self.error = str(exc)
        return self._table

    def for_tenant(self, tenant: str) -> Quota:
        return self.table().for_tenant(tenant)
