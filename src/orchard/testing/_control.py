"""The fake control plane: SandboxService and PoolService as the gateway answers them.

Validation follows ``services/scheduler/validation.py`` and the gateway
(same status codes, reasons and the field named in the message) for the
refusals a client meets in practice: a bad or missing API key, an unknown or
malformed image, out-of-range resources or ttl, bad labels, env names and
request ids, image/resources/network given with a template, an unknown
template, an unknown sandbox (another tenant's answers the same).

What the fake does not do: quotas, create rate limits, TTL reaping (the
expiry is reported, never acted on), warm pools (a template create is a
cold create counted as a miss), and network policies are recorded, not
enforced (commands run on the host).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator
from functools import wraps
from importlib.metadata import version as _package_version
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from orchard._proto.orchard.v1 import (
    common_pb2,
    pools_pb2,
    pools_pb2_grpc,
    sandbox_pb2,
    sandbox_pb2_grpc,
)

from ._files import seed_files
from ._rpc import CallContext
from ._sandboxes import SandboxRuntimes
from ._status import Refusal, invalid, not_found, precondition
from ._world import GIB, MIB, SandboxRecord, World, new_sandbox_id

SERVER_VERSION = _package_version("orchard-env")
IMAGE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}(:[A-Za-z0-9._-]{1,128})?$")
LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
)
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
REQUEST_ID_RE = re.compile(r"^[\x21-\x7e]{1,128}$")
MAX_TTL_SECONDS = 7 * 24 * 3600
DEFAULT_TTL_SECONDS = 3600
MAX_HINT_AHEAD_SECONDS = 24 * 3600
# (field, default, low, high, unit) as the real scheduler's CreateLimits defaults.
_BOUNDS = {
    "cpu_millis": (1000, 50, 64_000, "millicores"),
    "memory_bytes": (GIB, 16 * MIB, 256 * GIB, "bytes"),
    "pids": (512, 8, 65_536, "processes"),
}
_MODES = {
    "none": common_pb2.NetworkPolicy.NONE,
    "allowlist": common_pb2.NetworkPolicy.ALLOWLIST,
    "internet": common_pb2.NetworkPolicy.INTERNET,
}

F = TypeVar("F", bound=Callable[..., Any])


def refusals(fn: F) -> F:
    """Turn a :class:`Refusal` raised by a unary servicer method into its status."""

    @wraps(fn)
    def wrapper(self: Any, request: Any, context: CallContext) -> Any:
        try:
            return fn(self, request, context)
        except Refusal as exc:
            context.refuse(exc)

    return wrapper  # type: ignore[return-value]


def refusals_streaming(fn: F) -> F:
    """:func:`refusals` for servicer methods that yield their responses."""

    @wraps(fn)
    def wrapper(self: Any, request: Any, context: CallContext) -> Iterator[Any]:
        try:
            yield from fn(self, request, context)
        except Refusal as exc:
            context.refuse(exc)

    return wrapper  # type: ignore[return-value]


def _state_name(rec: SandboxRecord) -> str:
    return sandbox_pb2.SandboxState.Name(rec.state)  # type: ignore[arg-type]


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def _bounded(name: str, value: int, default: int, low: int, high: int, unit: str) -> int:
    if value == 0:
        return default
    if not low <= value <= high:
        raise invalid(
            f"{name} must be between {low} and {high} {unit} (got {value}); 0 means the default {default}"
        )
    return value


def check_labels(labels: dict[str, str], what: str = "labels") -> dict[str, str]:
    if len(labels) > 64:
        raise invalid(f"{what}: at most 64 labels (got {len(labels)})")
    for key, value in labels.items():
        if not LABEL_KEY_RE.match(key):
            raise invalid(f"{what}: key {key[:80]!r} is not a valid label key")
        if len(value) > 256 or any(ord(c) < 0x20 for c in value):
            raise invalid(f"{what}[{key}]: value too long or has control characters")
    return dict(labels)


def check_env(env: dict[str, str]) -> dict[str, str]:
    if len(env) > 256:
        raise invalid(f"env: at most 256 variables (got {len(env)})")
    for key, value in env.items():
        if not ENV_KEY_RE.match(key):
            raise invalid(
                f"env: {key[:80]!r} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        if "\x00" in value:
            raise invalid(f"env[{key}]: value contains a NUL byte")
    return dict(env)


def check_network(policy: common_pb2.NetworkPolicy) -> common_pb2.NetworkPolicy:
    mode = policy.mode or common_pb2.NetworkPolicy.NONE
    if mode not in _MODES.values():
        raise invalid(f"network.mode: unknown mode {policy.mode}")
    if mode != common_pb2.NetworkPolicy.ALLOWLIST and (
        policy.cidrs or policy.ports or policy.domains
    ):
        raise invalid("network: cidrs, ports and domains are only for mode ALLOWLIST")
    for port in policy.ports:
        if not 1 <= port <= 65535:
            raise invalid(f"network.ports: {port} is not a port number")
    checked = common_pb2.NetworkPolicy()
    checked.CopyFrom(policy)
    checked.mode = mode
    return checked


KNOWN_TOOL_LAYERS = ("harnesses",)
"""The tools layer names the real scheduler knows (``orchard.scheduler.tools.layers``)."""


def check_tool_layers(world: World, names: list[str]) -> tuple[str, ...]:
    """``tool_layers`` checked as the real scheduler and local backend check them."""
    for i, name in enumerate(names):
        if name not in KNOWN_TOOL_LAYERS:
            raise invalid(
                f"tool_layers: unknown tools layer {name[:40]!r} "
                f"(known: {', '.join(KNOWN_TOOL_LAYERS)})"
            )
        if name in names[:i]:
            raise invalid(f"tool_layers: {name} given twice")
        if name not in world.built_tool_layers:
            raise Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                "TOOLS_LAYER_NOT_BUILT",
                f"tools layer {name!r} is not built on this node: run `make tools-layer`",
                "infrastructure",
            )
    return tuple(names)


def remove_sandbox(world: World, runtimes: SandboxRuntimes, rec: SandboxRecord, why: str) -> None:
    """Mark ``rec`` DELETED, kill what runs in it and remove its directory (twice is a no-op)."""
    with world.lock:
        if rec.state == sandbox_pb2.DELETED:
            return
        was_claimed = rec.state == sandbox_pb2.CLAIMED
        rec.state, rec.state_reason = sandbox_pb2.DELETED, why
        if was_claimed and rec.template in world.pool_counters:
            world.pool_counters[rec.template].claimed -= 1
    runtimes.discard(rec.id)
    world.remove_root(rec)


class FakeSandboxService:
    def __init__(self, world: World, runtimes: SandboxRuntimes) -> None:
        self.world = world
        self.runtimes = runtimes

    def _answer(self, rec: SandboxRecord) -> sandbox_pb2.Sandbox:
        msg = sandbox_pb2.Sandbox(
            id=rec.id,
            image=rec.image,
            resources=rec.resources,
            network=rec.network,
            state=rec.state,  # type: ignore[arg-type]
            state_reason=rec.state_reason,
            labels=rec.labels,
            env=rec.env,
            created_at=_timestamp(rec.created_at),
            expires_at=_timestamp(rec.expires_at),
            tenant=rec.tenant,
            template=rec.template,
            ttl_seconds=rec.ttl_seconds,
            model_endpoint=rec.model_endpoint,
            tool_layers=list(rec.tool_layers),
        )
        if rec.usable:
            msg.executor.CopyFrom(self._access(rec))
        return msg

    def _access(self, rec: SandboxRecord) -> sandbox_pb2.ExecutorAccess:
        token, expiry = self.world.issue_token(rec.id)
        return sandbox_pb2.ExecutorAccess(
            address=self.world.executor_address, token=token, token_expires_at=_timestamp(expiry)
        )

    def _checked_id(self, context: CallContext, sandbox_id: str) -> SandboxRecord:
        tenant = self.world.tenant_for(context.invocation_metadata())
        if not sandbox_id:
            raise invalid("id: a sandbox id is required")
        return self.world.get(tenant, sandbox_id)

    @refusals
    def CreateSandbox(
        self, request: sandbox_pb2.CreateSandboxRequest, context: CallContext
    ) -> sandbox_pb2.Sandbox:
        world = self.world
        tenant = world.tenant_for(context.invocation_metadata())
        template = None
        if request.template:
            given = [
                name
                for name, present in (
                    ("image", bool(request.image)),
                    (
                        "resources",
                        request.HasField("resources") and bool(request.resources.ByteSize()),
                    ),
                    ("network", request.HasField("network") and bool(request.network.ByteSize())),
                )
                if present
            ]
            if request.tool_layers:
                given.append("tool_layers")
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
            template = world.templates.get(request.template)
            if template is None:
                known = ", ".join(world.templates) or "none configured"
                raise not_found(
                    f"template {request.template[:80]!r} not found (templates: {known})",
                    "INVALID_FIELD",
                )
        image = template.image if template else request.image
        if image and not IMAGE_NAME_RE.match(image):
            raise invalid(f"image: {image[:140]!r} is not a valid image name")
        res = request.resources
        if template:
            resources = common_pb2.Resources(
                cpu_millis=template.cpu_millis,
                memory_bytes=template.memory_bytes,
                pids=template.pids,
            )
            network = common_pb2.NetworkPolicy(mode=_MODES[template.network])
        else:
            resources = common_pb2.Resources(
                **{
                    name: _bounded(f"resources.{name}", getattr(res, name), *bounds)
                    for name, bounds in _BOUNDS.items()
                }
            )
            network = check_network(request.network)
        ttl = _bounded(
            "ttl_seconds", request.ttl_seconds, DEFAULT_TTL_SECONDS, 1, MAX_TTL_SECONDS, "seconds"
        )
        if request.request_id and not REQUEST_ID_RE.match(request.request_id):
            raise invalid("request_id: up to 128 printable ASCII characters without spaces")
        labels = check_labels(dict(request.labels))
        env = check_env(dict(request.env))
        tool_layers = check_tool_layers(world, list(request.tool_layers))
        image = image or world.default_image()
        if image not in world.images:
            raise not_found(
                f"image {image!r} not found (images: {', '.join(world.images) or 'none'})",
                "IMAGE_NOT_FOUND",
            )
        with world.lock:
            if request.request_id:
                existing = world.by_request_id.get((tenant, request.request_id))
                if existing is not None:
                    rec = world.sandboxes[existing]
                    if not rec.usable:
                        raise precondition(
                            f"sandbox {rec.id} of request_id {request.request_id!r} was deleted",
                            "SANDBOX_NOT_READY",
                        )
                    return self._answer(rec)
            sandbox_id = new_sandbox_id()
            now = time.time()
            rec = SandboxRecord(
                id=sandbox_id,
                tenant=tenant,
                image=image,
                resources=resources,
                network=network,
                labels=labels,
                env=env,
                ttl_seconds=ttl,
                created_at=now,
                expires_at=now + ttl,
                template=request.template,
                request_id=request.request_id,
                root=world.new_root(sandbox_id),
                tool_layers=tool_layers,
                state=sandbox_pb2.CLAIMED if template else sandbox_pb2.READY,
                model_endpoint=world.model_endpoint_base if request.model_endpoint else "",
            )
            seed_files(rec.root, world.images[image].files)
            world.sandboxes[sandbox_id] = rec
            if request.request_id:
                world.by_request_id[(tenant, request.request_id)] = sandbox_id
            if template is not None:
                counters = world.pool_counters[template.name]
                counters.misses += 1
                counters.claimed += 1
        return self._answer(rec)

    @refusals
    def GetSandbox(
        self, request: sandbox_pb2.GetSandboxRequest, context: CallContext
    ) -> sandbox_pb2.Sandbox:
        return self._answer(self._checked_id(context, request.id))

    @refusals
    def ListSandboxes(
        self, request: sandbox_pb2.ListSandboxesRequest, context: CallContext
    ) -> sandbox_pb2.ListSandboxesResponse:
        tenant = self.world.tenant_for(context.invocation_metadata())
        wanted = check_labels(dict(request.labels)).items()
        with self.world.lock:
            records = [
                r
                for r in self.world.sandboxes.values()
                if r.tenant == tenant
                and r.state != sandbox_pb2.DELETED
                and wanted <= r.labels.items()
            ]
        answers = []
        for rec in records:
            msg = self._answer(rec)
            msg.ClearField("executor")
            answers.append(msg)
        return sandbox_pb2.ListSandboxesResponse(sandboxes=answers)

    @refusals
    def DeleteSandbox(
        self, request: sandbox_pb2.DeleteSandboxRequest, context: CallContext
    ) -> sandbox_pb2.DeleteSandboxResponse:
        remove_sandbox(
            self.world, self.runtimes, self._checked_id(context, request.id), "deleted by client"
        )
        return sandbox_pb2.DeleteSandboxResponse()

    @refusals
    def GetExecutorAccess(
        self, request: sandbox_pb2.GetSandboxRequest, context: CallContext
    ) -> sandbox_pb2.ExecutorAccess:
        rec = self._checked_id(context, request.id)
        if not rec.usable:
            raise precondition(
                f"sandbox {rec.id} is {_state_name(rec)}, not READY",
                "SANDBOX_NOT_READY",
            )
        return self._access(rec)

    @refusals
    def KeepAlive(
        self, request: sandbox_pb2.KeepAliveRequest, context: CallContext
    ) -> sandbox_pb2.Sandbox:
        rec = self._checked_id(context, request.id)
        ttl = request.ttl_seconds or rec.ttl_seconds
        if not 1 <= ttl <= MAX_TTL_SECONDS:
            raise invalid(
                f"ttl_seconds must be between 1 and {MAX_TTL_SECONDS} (got {ttl}); "
                "0 means the sandbox's own ttl"
            )
        if not rec.usable:
            raise precondition(
                f"sandbox {rec.id} is {_state_name(rec)}; only a running sandbox has a lease",
                "SANDBOX_NOT_READY",
            )
        with self.world.lock:
            end = min(time.time() + ttl, rec.created_at + MAX_TTL_SECONDS)
            rec.expires_at = max(rec.expires_at, end)
        return self._answer(rec)

    @refusals
    def UpdateNetworkPolicy(
        self, request: sandbox_pb2.UpdateNetworkPolicyRequest, context: CallContext
    ) -> sandbox_pb2.Sandbox:
        rec = self._checked_id(context, request.id)
        policy = check_network(request.network)
        if not rec.usable:
            raise precondition(
                f"sandbox {rec.id} is {_state_name(rec)}; "
                "only a running sandbox's policy can change",
                "SANDBOX_NOT_READY",
            )
        with self.world.lock:
            rec.network = policy
            rec.network_updates.append(policy)
        return self._answer(rec)

    @refusals
    def ListImages(
        self, request: sandbox_pb2.ListImagesRequest, context: CallContext
    ) -> sandbox_pb2.ListImagesResponse:
        self.world.tenant_for(context.invocation_metadata())
        default = self.world.default_image()
        return sandbox_pb2.ListImagesResponse(
            images=[
                sandbox_pb2.Image(
                    name=i.name,
                    size_bytes=i.size_bytes,
                    layers=i.layers,
                    is_default=i.name == default,
                )
                for i in self.world.images.values()
            ]
        )

    @refusals
    def GetTenant(
        self, request: sandbox_pb2.GetTenantRequest, context: CallContext
    ) -> sandbox_pb2.TenantView:
        """The caller's view: no quota (all zero: unlimited, the fake enforces none) and
        what its live sandboxes use."""
        tenant = self.world.tenant_for(context.invocation_metadata())
        with self.world.lock:
            live = [r for r in self.world.sandboxes.values() if r.tenant == tenant and r.usable]
        return sandbox_pb2.TenantView(
            tenant=tenant,
            quota=sandbox_pb2.TenantQuota(),
            usage=sandbox_pb2.TenantUsage(
                sandboxes=len(live),
                cpu_millis=sum(r.resources.cpu_millis for r in live),
                memory_bytes=sum(r.resources.memory_bytes for r in live),
            ),
            server_version=f"{SERVER_VERSION}+fake",  # a PEP 440 local version: still parses
        )


class FakePoolService:
    def __init__(self, world: World) -> None:
        self.world = world

    def _status(self, name: str) -> pools_pb2.PoolStatus:
        t = self.world.templates[name]
        c = self.world.pool_counters[name]
        claims = c.hits + c.misses
        return pools_pb2.PoolStatus(
            template=pools_pb2.Template(
                name=t.name,
                image=t.image,
                resources=common_pb2.Resources(
                    cpu_millis=t.cpu_millis, memory_bytes=t.memory_bytes, pids=t.pids
                ),
                network=common_pb2.NetworkPolicy(mode=_MODES[t.network]),
                runtime_class=t.runtime_class,
            ),
            claimed=c.claimed,
            min=t.min,
            max=t.max,
            target=t.min,
            hits=c.hits,
            misses=c.misses,
            hit_rate=c.hits / claims if claims else 0.0,
            hinted=c.hinted,
            created=claims,
        )

    @refusals
    def ListPools(
        self, request: pools_pb2.ListPoolsRequest, context: CallContext
    ) -> pools_pb2.ListPoolsResponse:
        self.world.tenant_for(context.invocation_metadata())
        with self.world.lock:
            return pools_pb2.ListPoolsResponse(
                pools=[self._status(n) for n in self.world.templates]
            )

    @refusals
    def Hint(self, request: pools_pb2.DemandHint, context: CallContext) -> pools_pb2.HintResponse:
        tenant = self.world.tenant_for(context.invocation_metadata())
        if not request.template:
            raise invalid("template: a template name is required")
        template = self.world.templates.get(request.template)
        if template is None:
            known = ", ".join(self.world.templates) or "none configured"
            raise not_found(
                f"template {request.template[:80]!r} not found (templates: {known})",
                "INVALID_FIELD",
            )
        if not 1 <= request.count <= max(1, template.max):
            raise invalid(
                f"count must be between 1 and the pool's max ({template.max}); got {request.count}"
            )
        within = request.within_seconds
        if not math.isfinite(within) or not 0 <= within <= MAX_HINT_AHEAD_SECONDS:
            raise invalid(
                f"within_seconds must be between 0 and {MAX_HINT_AHEAD_SECONDS}; got {within}"
            )
        with self.world.lock:
            self.world.pool_counters[template.name].hints[tenant] = request.count
            return pools_pb2.HintResponse(pool=self._status(template.name))


def register(world: World, runtimes: SandboxRuntimes) -> list[tuple[Any, Any]]:
    """The (add_to_server, servicer) pairs of the control plane."""
    return [
        (
            sandbox_pb2_grpc.add_SandboxServiceServicer_to_server,
            FakeSandboxService(world, runtimes),
        ),
        (pools_pb2_grpc.add_PoolServiceServicer_to_server, FakePoolService(world)),
    ]
