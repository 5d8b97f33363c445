"""Find a sandbox's root, init socket and metadata for a call.

There are two ways to find a sandbox, behind one small interface
(:class:`SandboxLocator`), so the exec engine and the servicer are the same
in both:

- :class:`SandboxDirectory` (the node executor): every sandbox of the node, as
  the backend laid them out under ``<home>/sandboxes/<id>/``; the rootfs is the
  sandbox's overlay mount seen from the host.
- :class:`SingleSandbox` (the injected executor, running inside the sandbox
  it serves): exactly one sandbox, whose ``sandbox.json`` and init socket are
  in a run folder inside the container (``/.orchard/run``) and whose rootfs
  is ``/``.

The backend (or the pod's set-up) writes sandbox.json and the init socket;
the executor only reads them. Each lookup is one ``stat`` of sandbox.json: the
parsed metadata is cached and re-read only when the file changes, so a call
costs the same with 1 or 1000 sandboxes on the node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchard.common.errors import invalid, not_found
from orchard.common.layout import NodeLayout, SandboxMeta, is_valid_sandbox_id

META_FILE = "sandbox.json"
INIT_SOCKET = "init.sock"
# A node holds at most a few thousand live sandboxes; entries of deleted ones
# are dropped oldest first once this many are remembered (a 20-minute soak of
# 39k create/delete cycles grew the executor by ~85 MiB while these were
# unbounded). A dropped live entry costs one stat and parse on its next call.
MAX_REMEMBERED_SANDBOXES = 4096


@dataclass(frozen=True, slots=True)
class Sandbox:
    """What a call needs to reach one sandbox."""

    sandbox_id: str
    rootfs: Path
    """The sandbox's root as this executor sees it (files are confined to it)."""
    meta: SandboxMeta
    socket_path: str
    """orchard-init's control socket, as this executor reaches it."""


class SandboxLocator(Protocol):
    """How the servicer finds the sandbox a call names."""

    def get(self, sandbox_id: str) -> Sandbox:
        """The sandbox, or NOT_FOUND/SANDBOX_NOT_FOUND; the id must be checked."""
        ...

    def forget(self, sandbox_id: str) -> None:
        """Drop the cached entry (e.g. init's socket refused a connection)."""
        ...

    def is_gone(self, sandbox: Sandbox) -> bool:
        """Whether ``sandbox`` (found earlier) is gone or being deleted (``gone.py``)."""
        ...


def check_sandbox_id(sandbox_id: str) -> None:
    """Refuse an id that could not have come from the scheduler."""
    if not is_valid_sandbox_id(sandbox_id):
        raise invalid(f"sandbox_id {sandbox_id[:80]!r} is not a valid sandbox id")


class _MetaCache:
    """sandbox.json parsed once per change of its (inode, mtime, size)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple[int, int, int], Sandbox]] = {}

    def load(self, sandbox_id: str, meta_path: str, rootfs: Path, socket: Path) -> Sandbox:
        try:
            st = os.stat(meta_path)
        except OSError:
            self._entries.pop(sandbox_id, None)
            raise _missing(sandbox_id) from None
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._entries.get(sandbox_id)
        if cached is not None and cached[0] == signature:
            return cached[1]
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = SandboxMeta.from_json(f.read())
        except (OSError, ValueError, KeyError, TypeError):
            raise _missing(sandbox_id) from None
        if meta.sandbox_id != sandbox_id or not os.path.exists(socket):
            raise _missing(sandbox_id)
        sandbox = Sandbox(sandbox_id, rootfs, meta, str(socket))
        self._entries.pop(sandbox_id, None)
        _drop_oldest(self._entries)
        self._entries[sandbox_id] = (signature, sandbox)
        return sandbox

    def forget(self, sandbox_id: str) -> None:
        self._entries.pop(sandbox_id, None)


class SandboxDirectory:
    """The sandboxes of this node, as the backend has laid them out on disk."""

    def __init__(self, layout: NodeLayout) -> None:
        self._layout = layout
        self._cache = _MetaCache()
        # Per id: (sandbox.json as str, rootfs, init socket). Building the
        # Path objects cost as much as the stat itself on every call.
        self._paths: dict[str, tuple[str, Path, Path]] = {}

    def get(self, sandbox_id: str) -> Sandbox:
        paths = self._paths.get(sandbox_id)
        if paths is None:
            layout = self._layout.sandbox(sandbox_id)
            paths = (str(layout.meta_file), layout.rootfs, layout.init_socket)
            _drop_oldest(self._paths)
            self._paths[sandbox_id] = paths
        return self._cache.load(sandbox_id, *paths)

    def forget(self, sandbox_id: str) -> None:
        self._cache.forget(sandbox_id)

    def is_gone(self, sandbox: Sandbox) -> bool:
        """The backend's delete writes its marker before anything else goes (init, the
        root's mount, the folder with sandbox.json), so the marker or a missing
        sandbox.json means the sandbox is going. (A dead init alone is a broken sandbox.)"""
        layout = self._layout.sandbox(sandbox.sandbox_id)
        return layout.deleting_marker.exists() or not layout.meta_file.exists()


class SingleSandbox:
    """The one sandbox an injected executor runs in: root ``/``, files in ``run_dir``.

    Any other sandbox id is NOT_FOUND, exactly like an id the node does not
    have, so a token for another sandbox learns nothing here either.
    """

    def __init__(self, run_dir: Path, rootfs: Path = Path("/")) -> None:
        self._meta_file = str(run_dir / META_FILE)
        self._socket = run_dir / INIT_SOCKET
        self._rootfs = rootfs
        self._cache = _MetaCache()

    def get(self, sandbox_id: str) -> Sandbox:
        return self._cache.load(sandbox_id, self._meta_file, self._rootfs, self._socket)

    def forget(self, sandbox_id: str) -> None:
        self._cache.forget(sandbox_id)

    def is_gone(self, sandbox: Sandbox) -> bool:
        return False  # this executor lives in the sandbox and goes with it


def _drop_oldest(entries: dict[str, Any]) -> None:
    """Make room for one more entry: forget the oldest insertions past the bound."""
    while len(entries) >= MAX_REMEMBERED_SANDBOXES:
        del entries[next(iter(entries))]


def _missing(sandbox_id: str) -> Exception:
    return not_found(f"sandbox {sandbox_id} does not exist on this node", "SANDBOX_NOT_FOUND")
