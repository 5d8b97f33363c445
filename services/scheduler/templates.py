"""Templates: what a warm pool keeps ready, read from ``<home>/templates.toml`` (or ``.json``).

A template is everything about a sandbox that must be fixed before it starts
(image, resources, network policy class, runtime class, a base env) plus the
size of its pool. Everything a claim may still change (env on top, labels,
ttl, the owner, files) is left out, so one pool serves every claim::

    [templates.py-small]
    image = ""            # "" = the default image
    cpu_millis = 1000
    memory_bytes = 1073741824
    pids = 512
    network = "none"      # policy class: none | allowlist | internet
    # with network = "allowlist": cidrs = ["203.0.113.0/24"], ports = [443],
    # domains = ["pypi.org", "*.pythonhosted.org"] (at least one cidr or domain)
    runtime_class = ""    # locally "", "runc", "injected" or "runsc"; on Kubernetes a RuntimeClass
    env = { LANG = "C.UTF-8" }
    min = 2               # always keep this many ready
    max = 50              # never hold more than this (ready + being made)
    idle_ttl_seconds = 3600  # an unclaimed member is recycled after this

The JSON form is the same tree: ``{"templates": {"py-small": {...}}}``. The
operator owns this file; a bad file stops the scheduler at start with a message
naming the template and the field, instead of serving half a configuration.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard._proto.orchard.v1 import common_pb2, pools_pb2
from orchard.common.errors import ServiceError

from .backends.base import CHECK_RUNTIME_CLASS, Backend, BackendError, supports
from .backends.netpolicy.policy import (
    MODE_ALLOWLIST,
    MODE_INTERNET,
    MODE_NONE,
    NetworkPolicySpec,
    PolicyError,
    build_policy,
)
from .network_policies import mode_number, policy_to_proto
from .settings import CreateLimits
from .validation import validate_env

TEMPLATE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?$")
# A runtime class names a local mode ("runc", "injected") or a Kubernetes
# RuntimeClass object (a DNS label such as "gvisor"); whether the backend in
# use offers it is checked when the scheduler starts (``check_runtime_classes``).
RUNTIME_CLASS_RE = re.compile(r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)?$")
NETWORK_CLASSES = (MODE_NONE, MODE_ALLOWLIST, MODE_INTERNET)
_KNOWN_KEYS = {
    "image", "cpu_millis", "memory_bytes", "pids", "network", "cidrs", "ports", "domains",
    "runtime_class", "env", "min", "max", "idle_ttl_seconds",
}  # fmt: skip
HARD_MAX_POOL = 10_000


class TemplateConfigError(Exception):
    """The templates file is malformed; the message names the template and field."""


@dataclass(frozen=True)
class Template:
    name: str
    image: str = ""
    cpu_millis: int = 1000
    memory_bytes: int = 1 << 30
    pids: int = 512
    network: NetworkPolicySpec = field(default_factory=NetworkPolicySpec)
    """The whole policy every member starts with (mode and, for allowlist, its lists)."""
    runtime_class: str = ""
    env: dict[str, str] = field(default_factory=dict)
    min: int = 0
    max: int = 16
    idle_ttl_seconds: int = 3600

    @property
    def network_mode(self) -> int:
        """The policy's mode as the proto enum number (what the store keeps)."""
        return mode_number(self.network)

    def to_proto(self) -> pools_pb2.Template:
        return pools_pb2.Template(
            name=self.name,
            image=self.image,
            resources=common_pb2.Resources(
                cpu_millis=self.cpu_millis, memory_bytes=self.memory_bytes, pids=self.pids
            ),
            network=policy_to_proto(self.network),
            runtime_class=self.runtime_class,
        )


def _int(name: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TemplateConfigError(f"template {name!r}: {key} must be an integer")
    if not low <= value <= high:
        raise TemplateConfigError(f"template {name!r}: {key} must be between {low} and {high}")
    return value


def parse_template(name: str, raw: Any, limits: CreateLimits) -> Template:
    """One template from its table; raises TemplateConfigError naming what is wrong."""
    if not TEMPLATE_NAME_RE.match(name):
        raise TemplateConfigError(
            f"template name {name[:80]!r}: lowercase letters, digits, '.', '_', '-' (up to 63)"
        )
    if not isinstance(raw, dict):
        raise TemplateConfigError(f"template {name!r}: must be a table of settings")
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise TemplateConfigError(f"template {name!r}: unknown settings {', '.join(unknown)}")
    image = raw.get("image", "")
    if not isinstance(image, str) or (image and not IMAGE_RE.match(image)):
        raise TemplateConfigError(f"template {name!r}: image {image!r} is not a valid image name")
    network = _network(name, raw)
    runtime_class = raw.get("runtime_class", "")
    if not isinstance(runtime_class, str) or not RUNTIME_CLASS_RE.match(runtime_class):
        raise TemplateConfigError(
            f"template {name!r}: runtime_class {str(runtime_class)[:80]!r} is not a runtime "
            "class name (e.g. runc, injected, gvisor)"
        )
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise TemplateConfigError(f"template {name!r}: env must map names to strings")
    try:
        env = validate_env(env, limits)
    except ServiceError as exc:
        raise TemplateConfigError(f"template {name!r}: {exc.message}") from None
    pool_min = _int(name, "min", raw.get("min", 0), 0, HARD_MAX_POOL)
    pool_max = _int(name, "max", raw.get("max", max(pool_min, 16)), 0, HARD_MAX_POOL)
    if pool_max < pool_min:
        raise TemplateConfigError(f"template {name!r}: max ({pool_max}) is below min ({pool_min})")
    return Template(
        name=name,
        image=image,
        cpu_millis=_int(
            name,
            "cpu_millis",
            raw.get("cpu_millis", limits.default_cpu_millis),
            limits.min_cpu_millis,
            limits.max_cpu_millis,
        ),
        memory_bytes=_int(
            name,
            "memory_bytes",
            raw.get("memory_bytes", limits.default_memory_bytes),
            limits.min_memory_bytes,
            limits.max_memory_bytes,
        ),
        pids=_int(
            name, "pids", raw.get("pids", limits.default_pids), limits.min_pids, limits.max_pids
        ),
        network=network,
        runtime_class=runtime_class,
        env=env,
        min=pool_min,
        max=pool_max,
        idle_ttl_seconds=_int(
            name,
            "idle_ttl_seconds",
            raw.get("idle_ttl_seconds", 3600),
            10,
            limits.max_ttl_seconds,
        ),
    )


def _network(name: str, raw: dict[str, Any]) -> NetworkPolicySpec:
    mode = raw.get("network", MODE_NONE)
    if mode not in NETWORK_CLASSES:
        raise TemplateConfigError(
            f"template {name!r}: network {str(mode)[:40]!r} is not one of "
            f"{', '.join(NETWORK_CLASSES)}"
        )
    lists: dict[str, list[Any]] = {}
    for key in ("cidrs", "ports", "domains"):
        value = raw.get(key, [])
        if not isinstance(value, list):
            raise TemplateConfigError(f"template {name!r}: {key} must be a list")
        lists[key] = value
    if not all(isinstance(c, str) for c in lists["cidrs"] + lists["domains"]) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in lists["ports"]
    ):
        raise TemplateConfigError(
            f"template {name!r}: cidrs and domains are lists of strings, ports of integers"
        )
    try:
        return build_policy(str(mode), lists["cidrs"], lists["ports"], lists["domains"])
    except PolicyError as exc:
        raise TemplateConfigError(f"template {name!r}: {exc}") from None


def parse_templates(data: Any, limits: CreateLimits) -> dict[str, Template]:
    if not isinstance(data, dict):
        raise TemplateConfigError("the templates file must hold a 'templates' table")
    extra = sorted(set(data) - {"templates"})
    if extra:
        raise TemplateConfigError(f"unknown top-level keys: {', '.join(extra)}")
    tables = data.get("templates", {})
    if not isinstance(tables, dict):
        raise TemplateConfigError("'templates' must be a table of named templates")
    return {name: parse_template(name, raw, limits) for name, raw in tables.items()}


def load_templates(home: Path, limits: CreateLimits) -> dict[str, Template]:
    """Templates from ``<home>/templates.toml`` or ``<home>/templates.json`` (none: empty)."""
    toml_path, json_path = home / "templates.toml", home / "templates.json"
    if toml_path.exists() and json_path.exists():
        raise TemplateConfigError(f"both {toml_path} and {json_path} exist; keep one")
    try:
        if toml_path.exists():
            data: Any = tomllib.loads(toml_path.read_text())
            where = toml_path
        elif json_path.exists():
            data = json.loads(json_path.read_text())
            where = json_path
        else:
            return {}
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TemplateConfigError(f"cannot parse the templates file: {exc}") from None
    try:
        return parse_templates(data, limits)
    except TemplateConfigError as exc:
        raise TemplateConfigError(f"{where}: {exc}") from None


def check_runtime_classes(templates: dict[str, Template], backend: Backend) -> None:
    """Every template's runtime class is one the backend runs (checked once, at start).

    A backend that declares ``CHECK_RUNTIME_CLASS`` (local: "", runc, injected with
    a bundle) decides; others (Kubernetes: any RuntimeClass the cluster has) take
    the name as it is.
    """
    checker = supports(backend, CHECK_RUNTIME_CLASS)
    if checker is None:
        return
    for template in templates.values():
        try:
            checker.check_runtime_class(template.runtime_class)
        except BackendError as exc:
            raise TemplateConfigError(f"template {template.name!r}: {exc.message}") from None
