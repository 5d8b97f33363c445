"""Settings of the model proxy (``python -m orchard.modelproxy``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

UPSTREAM_KINDS = ("vllm", "sglang", "openai")
"""How to ask an upstream for token ids and logprobs (``upstream.TokenRequest``):
``vllm`` (``logprobs`` + ``return_token_ids`` + ``return_tokens_as_token_ids``), ``sglang``
(``logprobs`` + ``return_prompt_token_ids``-style extras), ``openai`` (a plain server: logprobs
only, no token ids; samples then say they are not token-exact)."""


@dataclass(frozen=True)
class ModelProxySettings:
    home: Path
    """Node home: ``run/modelproxy.addr`` and the recordings (``modelproxy/sessions/``) live here."""
    upstream: str
    """Base URL of the OpenAI-compatible inference server, e.g. ``http://127.0.0.1:8000/v1``;
    empty: sessions work, model calls are refused (503)."""
    gateway: str
    """The gateway that judges tenants' API keys (``GetTenant``); ``host:port``."""
    listen: str = "127.0.0.1:50090"
    """Port 0 picks a free one."""
    upstream_kind: str = "vllm"
    """One of :data:`UPSTREAM_KINDS`."""
    upstream_api_key: str = ""
    """Sent upstream as ``Authorization: Bearer``; the harness's own key is never forwarded."""
    public_url: str = ""
    """The base a harness reaches the proxy at (sandboxes see another address than loopback);
    empty: ``http://<listen address>``."""
    max_body_bytes: int = 8 * 1024 * 1024
    """Largest request body; larger is refused with 413 before it is read whole."""
    body_timeout_seconds: float = 30.0
    """A request body that takes longer to arrive is refused with 408 (slow-body clients)."""
    upstream_timeout_seconds: float = 600.0
    max_calls_per_session: int = 10_000
    """Recorded calls a session may hold; further calls are refused with 429."""
    max_session_bytes: int = 256 * 1024 * 1024
    """Recorded bytes a session may hold on disk; further calls are refused with 429."""
    max_open_sessions_per_tenant: int = 10_000
    max_concurrent_calls_per_session: int = 32
    """Model calls of one session in flight at once; more are refused with 429 (a harness's
    runaway fan-out holds no more than its share of the proxy and the upstream)."""
    max_concurrent_calls_per_tenant: int = 512
    """The same over all of a tenant's sessions: one tenant cannot starve another."""
    max_answer_bytes: int = 64 * 1024 * 1024
    """Largest upstream answer (unstreamed body, or a stream's total); larger is a 502."""
    key_cache_seconds: float = 60.0
    """How long a key the gateway accepted is trusted without asking again."""
    gateway_ca: Path | None = None
    """The CA of a TLS gateway (``grpcs://``); None = the system's roots or plaintext."""

    @property
    def data_dir(self) -> Path:
        return self.home / "modelproxy"
