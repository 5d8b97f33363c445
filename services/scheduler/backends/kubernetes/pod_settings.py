"""Per-pool pod settings (``pods.json``): what the Helm chart says about each pool's pods.

The chart writes the Kubernetes-only part of every pool (non-root uid, spot
placement, RuntimeClass) into ``pods.json`` beside ``templates.toml`` and mounts
it at ``<home>/pods.json``; image and resources come from ``templates.toml``.
This module turns that file into ``PodTemplate``s by pool name, refusing
anything it does not understand with an error that names the pool and field
(a typo must not silently put a pool on on-demand nodes or run it as root):

    {"swe-spot": {"run_as_non_root": true, "run_as_user": 65532,
                  "runtime_class_name": "gvisor", "network_class": "internet",
                  "node_selector": {"orchard.dev/capacity": "spot"},
                  "tolerations": [{"key": "orchard.dev/spot", "operator": "Exists",
                                   "effect": "NoSchedule"}]}}
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .settings import PodTemplate

POD_SETTINGS_FILE = "pods.json"
MAX_FILE_BYTES = 1 << 20
# templates.toml's pool names; RuntimeClass / PriorityClass names are DNS subdomains.
POOL_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")
NETWORK_CLASSES = ("none", "allowlist", "internet")
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
TOLERATION_FIELDS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})
POOL_FIELDS = frozenset(
    {
        "run_as_non_root",
        "run_as_user",
        "runtime_class_name",
        "network_class",
        "node_selector",
        "tolerations",
        "priority_class_name",
    }
)
MAX_UID = 2**31 - 1


class PodSettingsError(ValueError):
    """pods.json is unreadable or invalid; the message names the file, pool and field."""


def load_pod_settings(path: Path) -> dict[str, PodTemplate]:
    """``PodTemplate``s by pool name from ``path`` (a PodSettingsError if anything is off)."""
    try:
        with open(path, "rb") as src:
            raw = src.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise PodSettingsError(f"{path}: cannot read: {err.strerror or err}") from err
    if len(raw) > MAX_FILE_BYTES:
        raise PodSettingsError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise PodSettingsError(f"{path}: not JSON: {err}") from err
    return parse_pod_settings(data, source=str(path))


def parse_pod_settings(data: Any, *, source: str = POD_SETTINGS_FILE) -> dict[str, PodTemplate]:
    """``PodTemplate``s by pool name from pods.json's parsed content."""
    if not isinstance(data, dict):
        raise PodSettingsError(f"{source}: must be an object of pools by name")
    pools: dict[str, PodTemplate] = {}
    for name, fields in data.items():
        if not isinstance(name, str) or not POOL_NAME_RE.match(name):
            raise PodSettingsError(f"{source}: pool name {str(name)[:64]!r} is not a valid name")
        pools[name] = _pool(name, fields, f"{source}: pool {name!r}")
    return pools


def _pool(name: str, fields: Any, where: str) -> PodTemplate:
    if not isinstance(fields, dict):
        raise PodSettingsError(f"{where}: must be an object")
    unknown = sorted(set(fields) - POOL_FIELDS)
    if unknown:
        raise PodSettingsError(
            f"{where}: unknown field {unknown[0][:64]!r} (known: {', '.join(sorted(POOL_FIELDS))})"
        )
    non_root = fields.get("run_as_non_root", False)
    if not isinstance(non_root, bool):
        raise PodSettingsError(f"{where}: run_as_non_root must be true or false")
    uid = fields.get("run_as_user")
    if uid is not None and (isinstance(uid, bool) or not isinstance(uid, int)):
        raise PodSettingsError(f"{where}: run_as_user must be an integer")
    if uid is not None and not 0 <= uid <= MAX_UID:
        raise PodSettingsError(f"{where}: run_as_user must be in 0..{MAX_UID}")
    if non_root and (uid is None or uid == 0):
        raise PodSettingsError(f"{where}: run_as_user must be a non-zero uid with run_as_non_root")
    network = fields.get("network_class", "none")
    if network not in NETWORK_CLASSES:
        raise PodSettingsError(
            f"{where}: network_class {str(network)[:64]!r} is not one of "
            f"{', '.join(NETWORK_CLASSES)}"
        )
    return PodTemplate(
        name=name,
        network_class=network,
        runtime_class_name=_dns_name(fields, "runtime_class_name", where),
        run_as_non_root=non_root,
        run_as_user=uid,
        node_selector=_node_selector(fields.get("node_selector"), where),
        tolerations=_tolerations(fields.get("tolerations"), where),
        priority_class_name=_dns_name(fields, "priority_class_name", where),
    )


def _dns_name(fields: Mapping[str, Any], key: str, where: str) -> str:
    value = fields.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str) or (value and not DNS_SUBDOMAIN_RE.match(value)):
        raise PodSettingsError(
            f'{where}: {key} {str(value)[:64]!r} is not a DNS subdomain name (or "")'
        )
    return value


def _node_selector(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PodSettingsError(f"{where}: node_selector must be an object of label: value")
    for key, label in value.items():
        if not isinstance(key, str) or not LABEL_KEY_RE.match(key):
            raise PodSettingsError(
                f"{where}: node_selector key {str(key)[:64]!r} is not a label key"
            )
        if not isinstance(label, str) or not LABEL_VALUE_RE.match(label):
            raise PodSettingsError(
                f"{where}: node_selector[{key!r}] {repr(label)[:64]} is not a label value"
            )
    return dict(value)


def _tolerations(value: Any, where: str) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise PodSettingsError(f"{where}: tolerations must be a list")
    found = []
    for i, item in enumerate(value):
        at = f"{where}: tolerations[{i}]"
        if not isinstance(item, dict):
            raise PodSettingsError(f"{at}: must be an object")
        unknown = sorted(set(item) - TOLERATION_FIELDS)
        if unknown:
            raise PodSettingsError(f"{at}: unknown field {unknown[0][:64]!r}")
        key = item.get("key", "")
        if not isinstance(key, str) or (key and not LABEL_KEY_RE.match(key)):
            raise PodSettingsError(f"{at}: key {str(key)[:64]!r} is not a taint key")
        operator = item.get("operator", "Equal")
        if operator not in TOLERATION_OPERATORS:
            raise PodSettingsError(f"{at}: operator {str(operator)[:64]!r} is not Exists or Equal")
        if operator == "Exists" and item.get("value"):
            raise PodSettingsError(f"{at}: value must be empty with operator Exists")
        if not isinstance(item.get("value", ""), str):
            raise PodSettingsError(f"{at}: value must be a string")
        effect = item.get("effect", "")
        if effect not in TOLERATION_EFFECTS:
            raise PodSettingsError(
                f"{at}: effect {str(effect)[:64]!r} is not one of "
                "NoSchedule, PreferNoSchedule, NoExecute"
            )
        seconds = item.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            raise PodSettingsError(f"{at}: tolerationSeconds must be an integer")
        if seconds is not None and effect != "NoExecute":
            raise PodSettingsError(f"{at}: tolerationSeconds needs effect NoExecute")
        found.append(dict(item))
    return tuple(found)
