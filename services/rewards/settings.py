"""Settings of the rewards service."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from orchard.common.tls import ServerTLS

from .judge.client import JudgeSettings


@dataclass(frozen=True)
class RewardSettings:
    home: Path
    """Node home: ``run/gateway.addr`` (default gateway) and ``run/rewards.addr`` live here."""
    gateway: str
    """The gateway the test runner creates sandboxes through (with the caller's key);
    ``grpcs://host:port`` for a TLS gateway."""
    gateway_ca: Path | None = None
    """The CA of a TLS gateway's certificate (``--gateway-ca``, ``$ORCHARD_TLS_CA``, which the
    SDK the test runner uses reads too); None = the system's roots."""
    tls: ServerTLS | None = None
    """Serve TLS (``--tls-cert``/``--tls-key``/``--tls-client-ca`` or ``$ORCHARD_TLS_*``);
    ``run/rewards.addr`` then says ``grpcs://``. None = plaintext."""
    listen: str = "127.0.0.1:50061"
    """Port 0 picks a free one."""
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    """From ORCHARD_JUDGE_BASE_URL / _MODEL / _API_KEY unless given."""
    value_model: Path | None = None
    """A trained reranker (``.npz`` from ``python -m orchard.rewards.rerank train``); Rank needs one."""
    max_concurrent_grades: int = 8
    """Sandboxes one service runs tests in at once; more wait (2 cores: keep it small)."""
    test_timeout_seconds: float = 1800.0
    key_cache_seconds: float = 60.0
    """How long a key the gateway accepted is trusted without asking again."""
    shutdown_grace_seconds: float = 5.0
