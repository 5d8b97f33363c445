"""A tools layer as a runc mount: the node's built layer, bind-mounted read-only.

The sandbox sees the layer at its fixed path and cannot write it: the bind is ``ro`` and
the sandbox has no CAP_SYS_ADMIN to remount it. A layer this node has not built (or built
from other pins) fails the create with TOOLS_LAYER_NOT_BUILT naming the build command;
there is never a sandbox that silently lacks the tools it asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...tools import LAYERS, ToolsLayerError, built_layer
from ..base import TOOLS_LAYER_NOT_BUILT, BackendError


def tool_layer_mount(tools_dir: Path, name: str) -> dict[str, Any]:
    if name not in LAYERS:
        raise BackendError.invalid(f"unknown tools layer {name[:40]!r}")
    try:
        folder = built_layer(tools_dir, name)
    except ToolsLayerError as err:
        raise BackendError(TOOLS_LAYER_NOT_BUILT, err.message) from None
    return {
        "destination": LAYERS[name].mount_path,
        "type": "bind",
        "source": str(folder),
        "options": ["rbind", "ro", "nosuid", "nodev"],
    }
