"""Checks on a CreateSandboxRequest, before anything is recorded or started.

Every refusal is INVALID_ARGUMENT (reason INVALID_FIELD) with a message that
names the field, so a client sees what to fix without reading server logs.
The network policy is checked by ``network_policies.policy_from_proto``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from orchard._proto.orchard.v1 import common_pb2, sandbox_pb2
from orchard.common.errors import ServiceError, invalid
from orchard.common.layout import IMAGE_NAME_RE

from .backends.netpolicy.policy import NetworkPolicySpec
from .network_policies import mode_number, policy_from_proto
from .settings import CreateLimits
from .tools import ToolsLayerError, check_names

# Label keys: like Kubernetes label names (an optional dns-ish prefix and a name).
LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
)
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
REQUEST_ID_RE = re.compile(r"^[\x21-\x7e]+$")

_Mode = common_pb2.NetworkPolicy.Mode


@dataclass(frozen=True)
class ValidatedCreate:
    """A create request with every default filled in and every field checked."""

    image: str
    cpu_millis: int
    memory_bytes: int
    pids: int
    ttl_seconds: int
    labels: dict[str, str]
    env: dict[str, str]
    request_id: str
    network_mode: int = _Mode.NONE
    network: NetworkPolicySpec = field(default_factory=NetworkPolicySpec)
    model_endpoint: bool = False
    tool_layers: tuple[str, ...] = ()


def _bounded(name: str, value: int, default: int, low: int, high: int, unit: str) -> int:
    if value == 0:
        return default
    if value < low or value > high:
        raise invalid(
            f"{name} must be between {low} and {high} {unit} (got {value}); 0 means the default {default}"
        )
    return value


def validate_labels(
    labels: dict[str, str], limits: CreateLimits, field: str = "labels"
) -> dict[str, str]:
    if len(labels) > limits.max_labels:
        raise invalid(f"{field}: at most {limits.max_labels} labels (got {len(labels)})")
    for key, value in labels.items():
        if not LABEL_KEY_RE.match(key):
            raise invalid(
                f"{field}: key {key[:80]!r} is not a valid label key "
                "(letters, digits, '.', '_', '-', up to 63 chars, optional 'prefix/')"
            )
        if len(value) > limits.max_label_value_chars:
            raise invalid(
                f"{field}[{key}]: value longer than {limits.max_label_value_chars} characters"
            )
        if any(ord(c) < 0x20 for c in value):
            raise invalid(f"{field}[{key}]: value contains control characters")
    return dict(labels)


def validate_env(env: dict[str, str], limits: CreateLimits) -> dict[str, str]:
    if len(env) > limits.max_env:
        raise invalid(f"env: at most {limits.max_env} variables (got {len(env)})")
    total = 0
    for key, value in env.items():
        if not ENV_KEY_RE.match(key):
            raise invalid(
                f"env: {key[:80]!r} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        if "\x00" in value:
            raise invalid(f"env[{key}]: value contains a NUL byte")
        size = len(value.encode())
        if size > limits.max_env_value_bytes:
            raise invalid(
                f"env[{key}]: value is {size} bytes; the limit is {limits.max_env_value_bytes}"
            )
        total += size + len(key) + 1
    if total > limits.max_env_total_bytes:
        raise invalid(f"env: {total} bytes in all; the limit is {limits.max_env_total_bytes}")
    return dict(env)


def validate_network(network: common_pb2.NetworkPolicy) -> NetworkPolicySpec:
    return policy_from_proto(network)


def validate_create(
    request: sandbox_pb2.CreateSandboxRequest, limits: CreateLimits
) -> ValidatedCreate:
    """The request with defaults applied, or a :class:`ServiceError` naming the bad field."""
    image = request.image
    if image and not IMAGE_NAME_RE.match(image):
        raise invalid(
            f"image: {image[:140]!r} is not a valid image name (lowercase letters, digits, '.', '_', '-', optional ':tag')"
        )
    res = request.resources
    cpu = _bounded(
        "resources.cpu_millis",
        res.cpu_millis,
        limits.default_cpu_millis,
        limits.min_cpu_millis,
        limits.max_cpu_millis,
        "millicores",
    )
    memory = _bounded(
        "resources.memory_bytes",
        res.memory_bytes,
        limits.default_memory_bytes,
        limits.min_memory_bytes,
        limits.max_memory_bytes,
        "bytes",
    )
    pids = _bounded(
        "resources.pids",
        res.pids,
        limits.default_pids,
        limits.min_pids,
        limits.max_pids,
        "processes",
    )
    ttl = _bounded(
        "ttl_seconds",
        request.ttl_seconds,
        limits.default_ttl_seconds,
        1,
        limits.max_ttl_seconds,
        "seconds",
    )
    request_id = request.request_id
    if request_id and (
        len(request_id) > limits.max_request_id_chars or not REQUEST_ID_RE.match(request_id)
    ):
        raise invalid(
            f"request_id: up to {limits.max_request_id_chars} printable ASCII characters without spaces"
        )
    network = validate_network(request.network)
    try:
        tool_layers = check_names(tuple(request.tool_layers))
    except ToolsLayerError as err:
        raise invalid(err.message) from None
    return ValidatedCreate(
        image=image,
        cpu_millis=cpu,
        memory_bytes=memory,
        pids=pids,
        ttl_seconds=ttl,
        labels=validate_labels(dict(request.labels), limits),
        env=validate_env(dict(request.env), limits),
        request_id=request_id,
        network_mode=mode_number(network),
        network=network,
        model_endpoint=request.model_endpoint,
        tool_layers=tool_layers,
    )


def validate_template_request(request: sandbox_pb2.CreateSandboxRequest) -> None:
    """A create naming a template leaves image, resources and network to the template."""
    res = request.resources
    net = request.network
    given = [
        name
        for name, present in (
            ("image", bool(request.image)),
            ("resources", bool(res.cpu_millis or res.memory_bytes or res.pids)),
            ("network", bool(net.mode or net.cidrs or net.ports or net.domains)),
            ("tool_layers", bool(request.tool_layers)),
        )
        if present
    ]
    if given:
        raise invalid(
            f"{', '.join(given)}: set by the template {request.template[:80]!r}; "
            "leave them unset when creating from a template"
        )
    if request.model_endpoint:
        raise invalid(
            "model_endpoint: not available with a template (its warm members are made "
            "without one); create the sandbox without a template"
        )


__all__ = [
    "ServiceError",
    "ValidatedCreate",
    "validate_create",
    "validate_env",
    "validate_labels",
    "validate_template_request",
]
