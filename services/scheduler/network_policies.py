"""The scheduler's record of each sandbox's full network policy, and the
proto <-> ``NetworkPolicySpec`` conversions.

The sandboxes table keeps only the mode (``network_mode``); the lists of an
allowlist (cidrs, ports, domains) and every later ``UpdateNetworkPolicy``
live here, in their own table of the same ``state.db``, so a restarted
scheduler answers with the policy in force. Rows of sandboxes the store has
forgotten are dropped when the table is opened.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from orchard._proto.orchard.v1 import common_pb2
from orchard.common.errors import invalid

from .backends.netpolicy.policy import (
    MODE_ALLOWLIST,
    MODE_INTERNET,
    MODE_NONE,
    NetworkPolicySpec,
    PolicyError,
    build_policy,
)

_Mode = common_pb2.NetworkPolicy.Mode
_TO_NAME = {
    _Mode.MODE_UNSPECIFIED: MODE_NONE,
    _Mode.NONE: MODE_NONE,
    _Mode.ALLOWLIST: MODE_ALLOWLIST,
    _Mode.INTERNET: MODE_INTERNET,
}
_TO_MODE = {MODE_NONE: _Mode.NONE, MODE_ALLOWLIST: _Mode.ALLOWLIST, MODE_INTERNET: _Mode.INTERNET}


def policy_from_proto(msg: common_pb2.NetworkPolicy) -> NetworkPolicySpec:
    """The checked policy, or INVALID_ARGUMENT (INVALID_FIELD) naming the bad field."""
    name = _TO_NAME.get(msg.mode)
    if name is None:
        raise invalid(f"network.mode: unknown value {msg.mode}")
    try:
        return build_policy(name, list(msg.cidrs), list(msg.ports), list(msg.domains))
    except PolicyError as err:
        raise invalid(str(err)) from None


def policy_to_proto(policy: NetworkPolicySpec) -> common_pb2.NetworkPolicy:
    return common_pb2.NetworkPolicy(
        mode=_TO_MODE[policy.mode],
        cidrs=list(policy.cidrs),
        ports=list(policy.ports),
        domains=list(policy.domains),
    )


def mode_number(policy: NetworkPolicySpec) -> int:
    return int(_TO_MODE[policy.mode])


def mode_name(mode: int) -> str:
    return _TO_NAME.get(mode, MODE_NONE)  # type: ignore[call-overload, no-any-return]


class NetworkPolicyTable:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS sandbox_network (id TEXT PRIMARY KEY, policy TEXT NOT NULL)"
        )
        has_sandboxes = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sandboxes'"
        ).fetchone()
        if has_sandboxes:
            self._db.execute(
                "DELETE FROM sandbox_network WHERE id NOT IN (SELECT id FROM sandboxes)"
            )

    def save(self, sandbox_id: str, policy: NetworkPolicySpec) -> None:
        self._db.execute(
            "INSERT INTO sandbox_network (id, policy) VALUES (?, ?)"
            " ON CONFLICT (id) DO UPDATE SET policy = excluded.policy",
            (sandbox_id, policy.to_json()),
        )

    def get(self, sandbox_id: str, mode: int) -> NetworkPolicySpec:
        """The sandbox's policy; without a row, the bare ``mode`` (a sandbox made before)."""
        row = self._db.execute(
            "SELECT policy FROM sandbox_network WHERE id = ?", (sandbox_id,)
        ).fetchone()
        if row is not None:
            return NetworkPolicySpec.from_json(str(row[0]))
        name = mode_name(mode)
        return NetworkPolicySpec(mode=name) if name != MODE_ALLOWLIST else NetworkPolicySpec()

    def close(self) -> None:
        self._db.close()
