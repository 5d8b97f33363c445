"""Find a sandbox's folder, init socket and metadata for a call.

The backend writes ``sandboxes/<id>/sandbox.json`` and the init socket; the
executor only reads them. Each lookup is one ``stat`` of sandbox.json: the
parsed metadata is cached per sandbox id and re-read only when the file
changes, so a call costs the same with 1 or 1000 sandboxes on the node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchard.common.errors import invalid, not_found
from orchard.common.layout import NodeLayout, SandboxLayout, SandboxMeta, is_valid_sandbox_id


@dataclass(frozen=True, slots=True)
class Sandbox:
    """What a call needs to reach one sandbox."""

    layout: SandboxLayout
    meta: SandboxMeta
    socket_path: str


def check_sandbox_id(sandbox_id: str) -> None:
    """Refuse an id that could not have come from the scheduler."""
    if not is_valid_sandbox_id(sandbox_id):
        raise invalid(f"sandbox_id {sandbox_id[:80]!r} is not a valid sandbox id")


class SandboxDirectory:
    """The sandboxes of this node, as the backend has laid them out on disk."""

    def __init__(self, layout: NodeLayout) -> None:
        self._layout = layout
        # sandbox id -> (stat signature of sandbox.json, the Sandbox)
        self._cache: dict[str, tuple[tuple[int, int, int], Sandbox]] = {}

    def get(self, sandbox_id: str) -> Sandbox:
        """The sandbox, or NOT_FOUND/SANDBOX_NOT_FOUND; the id must be checked."""
        layout = self._layout.sandbox(sandbox_id)
        meta_path = layout.meta_file
        try:
            st = os.stat(meta_path)
        except OSError:
            self._cache.pop(sandbox_id, None)
            raise _missing(sandbox_id) from None
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = self._cache.get(sandbox_id)
        if cached is not None and cached[0] == signature:
            return cached[1]
        try:
            meta = SandboxMeta.from_json(meta_path.read_text())
        except (OSError, ValueError, KeyError, TypeError):
            raise _missing(sandbox_id) from None
        if not os.path.exists(layout.init_socket):
            raise _missing(sandbox_id)
        sandbox = Sandbox(layout, meta, str(layout.init_socket))
        self._cache[sandbox_id] = (signature, sandbox)
        return sandbox

    def forget(self, sandbox_id: str) -> None:
        """Drop the cached entry (e.g. init's socket refused a connection)."""
        self._cache.pop(sandbox_id, None)


def _missing(sandbox_id: str) -> Exception:
    return not_found(f"sandbox {sandbox_id} does not exist on this node", "SANDBOX_NOT_FOUND")
