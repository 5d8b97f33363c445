"""Where a service says it listens: ``<home>/run/<name>.addr`` files, and the address in them.

The CLI, the SDK and ``orchard up`` find a running service by reading its
address file, so a reader must never see half an address: the file is written
to a temporary name beside it and renamed over (``os.replace`` is atomic on
one file system). It is removed on an orderly stop only, and only if it still
holds this process's address (a restarted service may have written its own).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "[::]", "::"})


def public_address(listen: str, port: int) -> str:
    """The address to give out for a server bound to ``listen`` on ``port``.

    A wildcard host becomes loopback (a client on this machine can reach it);
    a Unix socket (``unix:PATH``) has no port and is given out as it is.
    """
    if listen.startswith("unix:"):
        return listen
    host = listen.rsplit(":", 1)[0] if ":" in listen else listen
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1"
    return f"{host}:{port}"


def write_address_file(path: Path, address: str) -> None:
    """Write ``address`` (one line) to ``path`` atomically, making its folder if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(address + "\n")
    os.replace(tmp, path)


def remove_address_file(path: Path, address: str) -> None:
    """Remove ``path`` if it still holds ``address`` (not a successor's); absent is fine."""
    with contextlib.suppress(OSError):
        if path.read_text().strip() == address:
            path.unlink()
