"""Tools layers: harness CLIs mounted read-only into the sandboxes that ask for them.

``layers.py``: names, pins, paths, the lookup a backend does at create; ``build.py``: the
builder (``python -m orchard.scheduler.tools build``, ``make tools-layer``).
"""

from __future__ import annotations

from .layers import (
    BUILD_COMMAND,
    DEFAULT_LAYERS,
    HARNESSES,
    LAYERS,
    MOUNT_PATH,
    LayerSpec,
    NpmPin,
    PypiPin,
    ToolsLayerError,
    built_layer,
    check_names,
    tools_dir_from_env,
)

__all__ = [
    "BUILD_COMMAND",
    "DEFAULT_LAYERS",
    "HARNESSES",
    "LAYERS",
    "MOUNT_PATH",
    "LayerSpec",
    "NpmPin",
    "PypiPin",
    "ToolsLayerError",
    "built_layer",
    "check_names",
    "tools_dir_from_env",
]
