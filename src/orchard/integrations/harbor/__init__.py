"""Harbor on Orchard: ``harbor run --env orchard.integrations.harbor:OrchardEnvironment``.

Needs the ``[harbor]`` extra (Harbor itself needs Python 3.12 or newer); see
docs/integrations/harbor.md. ``OrchardEnvironment`` is imported on first use, so
:mod:`orchard.integrations.harbor.images` (no Harbor import) works without Harbor.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OrchardEnvironment"]


def __getattr__(name: str) -> Any:
    if name == "OrchardEnvironment":
        from .environment import OrchardEnvironment

        return OrchardEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
