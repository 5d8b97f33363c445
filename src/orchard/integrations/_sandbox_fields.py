"""The sandbox fields the adapters' configs share (mini-swe-agent, SWE-ReX).

Each host project configures its environment with a pydantic model; the part
that says which sandbox to run in (a cold create, a warm claim, or an existing
one) is the same everywhere and maps onto ``client.sandboxes.create`` the same
way, so it is written once here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class SandboxFields(BaseModel):
    """Which sandbox to run in (unknown fields are refused)."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = None
    """Image name; None: the server's default image."""
    template: str | None = None
    """Claim a warm sandbox of this template instead of a cold create."""
    sandbox_id: str | None = None
    """Use this existing sandbox; the adapter leaves it running when it is done."""
    cpu: float | str | None = None
    memory: int | str | None = None
    pids: int | None = None
    network: str = "none"
    ttl: float = 2 * 3600
    """Seconds until the server reaps a sandbox the run never cleaned up."""
    labels: dict[str, str] = {}

    def create_arguments(self, made_by: str) -> dict[str, Any]:
        """``sandboxes.create`` keywords; ``made_by`` labels the sandbox (``<made_by>: orchard``)."""
        return {
            "image": self.image,
            "cpu": self.cpu,
            "memory": self.memory,
            # A template carries its own network policy.
            "network": None if self.template else self.network,
            "ttl": self.ttl,
            "labels": {**self.labels, made_by: "orchard"},
            "pids": self.pids,
            "template": self.template,
        }
