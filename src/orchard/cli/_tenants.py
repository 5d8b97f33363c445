"""``orchard tenant ...``: the node admin's tenant commands (they edit files under the home).

    orchard tenant create NAME              make a tenant; prints its API key once
    orchard tenant ls [--json]              tenants, key counts, quotas
    orchard tenant revoke NAME              drop every key: its calls fail from now on
    orchard tenant rotate-key NAME [--keep-old]   a new key (the old stop working)
    orchard tenant quota NAME|default KEY=VALUE...   e.g. max_sandboxes=10 create_rate=5

They run on the node, as the user who owns ``ORCHARD_HOME`` (``--home``):
keys are stored only as sha256 hashes in ``api_keys.json``, quotas in
``quotas.json``; the running gateway re-reads both on change, no restart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from orchard.client import OrchardError
from orchard.common.layout import orchard_home
from orchard.common.quotas import Quota
from orchard.gateway.tenants import TenantError, TenantRegistry


class TenantCommandError(OrchardError):
    """A tenant command could not be done."""


def register(commands: Any) -> None:
    p = commands.add_parser("tenant", help="manage tenants, API keys and quotas (node admin)")
    p.add_argument(
        "--home",
        type=Path,
        default=None,
        help="node home (default $ORCHARD_HOME or /var/lib/orchard)",
    )
    sub = p.add_subparsers(dest="tenant_command", required=True, metavar="ACTION")
    create = sub.add_parser("create", help="make a tenant and print its API key (once)")
    create.add_argument("name", help="the tenant's name")
    create.set_defaults(run=cmd_create)
    ls = sub.add_parser("ls", help="list tenants with key counts and quotas")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    ls.set_defaults(run=cmd_ls)
    revoke = sub.add_parser("revoke", help="drop every key of a tenant")
    revoke.add_argument("name", help="the tenant's name")
    revoke.set_defaults(run=cmd_revoke)
    rotate = sub.add_parser("rotate-key", help="give a tenant a new key and print it (once)")
    rotate.add_argument("name", help="the tenant's name")
    rotate.add_argument("--keep-old", action="store_true", help="old keys keep working too")
    rotate.set_defaults(run=cmd_rotate)
    quota = sub.add_parser(
        "quota",
        help="set quotas of a tenant (or 'default'): KEY=VALUE, 0 = unlimited",
        description="Keys: " + ", ".join(Quota.__dataclass_fields__),
    )
    quota.add_argument("name", help="the tenant's name, or 'default' for every tenant without one")
    quota.add_argument(
        "settings", nargs="+", metavar="KEY=VALUE", help="a quota and its value (0 = unlimited)"
    )
    quota.set_defaults(run=cmd_quota)


def _registry(args: argparse.Namespace) -> TenantRegistry:
    return TenantRegistry((args.home or orchard_home()).resolve())


def _do(action: Any) -> Any:
    try:
        return action()
    except TenantError as exc:
        raise TenantCommandError(str(exc)) from None


def cmd_create(args: argparse.Namespace) -> int:
    key = _do(lambda: _registry(args).create(args.name))
    print(key)
    print(f"tenant {args.name} created; the key above is shown only once", file=sys.stderr)
    return 0


def cmd_rotate(args: argparse.Namespace) -> int:
    key = _do(lambda: _registry(args).rotate_key(args.name, keep_old=args.keep_old))
    print(key)
    print(f"new key for {args.name}; it is shown only once", file=sys.stderr)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    _do(lambda: _registry(args).revoke(args.name))
    print(f"tenant {args.name}: every key revoked", file=sys.stderr)
    return 0


def cmd_quota(args: argparse.Namespace) -> int:
    values: dict[str, str] = {}
    for item in args.settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise TenantCommandError(f"expected KEY=VALUE, got {item!r}")
        values[key] = value
    quota = _do(lambda: _registry(args).set_quota(args.name, values))
    print(json.dumps({"tenant": args.name, "quota": quota.to_mapping()}))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    tenants = _do(lambda: _registry(args).list())
    if args.json:
        for t in tenants:
            print(json.dumps({"tenant": t.name, "keys": t.keys, "quota": t.quota.to_mapping()}))
        return 0
    print(f"{'TENANT':<24} {'KEYS':>4}  QUOTA")
    for t in tenants:
        quota = " ".join(f"{k}={v}" for k, v in t.quota.to_mapping().items()) or "unlimited"
        state = "revoked" if t.revoked else str(t.keys)
        print(f"{t.name:<24} {state:>4}  {quota}")
    return 0
