"""What the fake holds: tenants and keys, images, templates, sandboxes, tokens.

One :class:`World` is shared by the fake's control-plane and data-plane
servicers (the real services share it through the scheduler's store and
signed tokens). Every access takes the world's lock; the servicers run on
call threads.
"""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchard._proto.orchard.v1 import common_pb2, sandbox_pb2

from ._status import not_found, unauthenticated

# The id format the real scheduler issues and the real executor checks
# (``orchard.common.layout.SANDBOX_ID_RE``).
SANDBOX_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
TOKEN_SECONDS = 3600.0
MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class FakeImage:
    """An image name the fake lists and accepts; ``files`` seed every new sandbox's root."""

    name: str
    files: Mapping[str, bytes | str] = field(default_factory=dict)
    is_default: bool = False
    size_bytes: int = 0
    layers: int = 1


@dataclass(frozen=True)
class FakeTemplate:
    """A template (PoolService) as an operator would configure it on the real scheduler."""

    name: str
    image: str = ""
    cpu_millis: int = 1000
    memory_bytes: int = GIB
    pids: int = 512
    network: str = "none"
    runtime_class: str = ""
    min: int = 0
    max: int = 8


# As the real node gives it (services/scheduler/backends/base.py).
MODEL_ENDPOINT_BASE = "http://127.0.0.1:7711"
MODEL_ENDPOINT_ENV = "ORCHARD_MODEL_BASE"


@dataclass
class SandboxRecord:
    """One fake sandbox: what the control plane reports, and its host directory."""

    id: str
    tenant: str
    image: str
    resources: common_pb2.Resources
    network: common_pb2.NetworkPolicy
    labels: dict[str, str]
    env: dict[str, str]
    ttl_seconds: int
    created_at: float
    expires_at: float
    template: str
    request_id: str
    root: Path
    state: int = sandbox_pb2.READY
    state_reason: str = ""
    network_updates: list[common_pb2.NetworkPolicy] = field(default_factory=list)
    model_endpoint: str = ""
    """The model endpoint's base URL its commands get as ORCHARD_MODEL_BASE ("" = none)."""
    tool_layers: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        return self.state in (sandbox_pb2.READY, sandbox_pb2.CLAIMED)


@dataclass
class PoolCounters:
    claimed: int = 0
    hits: int = 0
    misses: int = 0
    # One live hint per tenant (a new one replaces the last), as the real scheduler keeps.
    hints: dict[str, int] = field(default_factory=dict)

    @property
    def hinted(self) -> int:
        return sum(self.hints.values())


class World:
    """The fake's whole state."""

    def __init__(
        self,
        tenants: Mapping[str, list[str]],
        images: list[FakeImage],
        templates: list[FakeTemplate],
        executor_address: str,
        base_dir: Path | None,
    ) -> None:
        self.lock = threading.RLock()
        self._tenant_by_key = {key: tenant for tenant, keys in tenants.items() for key in keys}
        self.images = {image.name: image for image in images}
        self.templates = {t.name: t for t in templates}
        self.pool_counters = {t.name: PoolCounters() for t in templates}
        self.executor_address = executor_address
        self._base = Path(tempfile.mkdtemp(prefix="orchard-fake-", dir=base_dir))
        self.sandboxes: dict[str, SandboxRecord] = {}
        self.by_request_id: dict[tuple[str, str], str] = {}
        # token -> (sandbox id, expiry)
        self.tokens: dict[str, tuple[str, float]] = {}
        # (sandbox id, port inside) -> the local address it leads to (FakeOrchard.map_port)
        self.ports: dict[tuple[str, int], tuple[str, int]] = {}
        # What a model endpoint leads to (FakeOrchard.map_model_endpoint): commands run on
        # the host, so the URL is given to them as it is.
        self.model_endpoint_base = MODEL_ENDPOINT_BASE
        # The tools layers this fake node "has built" (FakeOrchard(tool_layers=...)).
        self.built_tool_layers: set[str] = set()
        self.closed = False

    @property
    def base_dir(self) -> Path:
        return self._base

    def default_image(self) -> str:
        for image in self.images.values():
            if image.is_default:
                return image.name
        return next(iter(self.images), "")

    # ---- auth -------------------------------------------------------------------

    def tenant_for(self, metadata: tuple[tuple[str, str], ...]) -> str:
        """The tenant of the call's API key, refused like the real gateway refuses."""
        authorization = _header(metadata, "authorization")
        if not authorization:
            raise _key_refused("missing API key: send 'authorization: Bearer <key>'")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise _key_refused("malformed authorization metadata: expected 'Bearer <key>'")
        tenant = self._tenant_by_key.get(key.strip())
        if tenant is None:
            raise _key_refused("invalid API key")
        return tenant

    def issue_token(self, sandbox_id: str) -> tuple[str, float]:
        token = "fake-" + secrets.token_urlsafe(24)
        expiry = time.time() + TOKEN_SECONDS
        with self.lock:
            self.tokens[token] = (sandbox_id, expiry)
        return token, expiry

    def check_token(self, sandbox_id: str, metadata: tuple[tuple[str, str], ...]) -> None:
        authorization = _header(metadata, "authorization")
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _token_refused("missing 'authorization: Bearer <token>' metadata")
        with self.lock:
            entry = self.tokens.get(token.strip())
        if entry is None:
            raise _token_refused("unknown token")
        if entry[0] != sandbox_id:
            raise _token_refused(f"the token is not for sandbox {sandbox_id[:80]!r}")
        if entry[1] < time.time():
            raise _token_refused("the token has expired")

    # ---- sandboxes ----------------------------------------------------------------

    def get(self, tenant: str, sandbox_id: str) -> SandboxRecord:
        with self.lock:
            rec = self.sandboxes.get(sandbox_id)
        if rec is None or rec.tenant != tenant:
            raise not_found(f"sandbox {sandbox_id[:80]!r} not found", "SANDBOX_NOT_FOUND")
        return rec

    def new_root(self, sandbox_id: str) -> Path:
        root = self._base / sandbox_id
        root.mkdir(mode=0o755)
        return root

    def remove_root(self, rec: SandboxRecord) -> None:
        shutil.rmtree(rec.root, ignore_errors=True)

    def close(self) -> None:
        self.closed = True
        shutil.rmtree(self._base, ignore_errors=True)


def new_sandbox_id() -> str:
    return "fake-" + secrets.token_hex(6)


def _header(metadata: tuple[tuple[str, str], ...], name: str) -> str | None:
    for key, value in metadata:
        if key == name:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


def _key_refused(message: str) -> Exception:
    return unauthenticated(message, "API_KEY_INVALID")


def _token_refused(message: str) -> Exception:
    return unauthenticated(f"sandbox token refused: {message}", "TOKEN_INVALID")
