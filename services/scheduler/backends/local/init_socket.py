"""The host end of a sandbox's init socket: a listening Unix stream socket.

The backend binds it at ``sandboxes/<id>/init.sock`` before the container
starts and hands the listening fd to runc (fd 3 in the container). Connections
queue in the kernel's backlog even before orchard-init calls accept(), so the
executor may connect as soon as ``create`` has returned.

A Unix socket path is limited to 107 bytes; homes deeper than that (test
folders) bind through ``/proc/self/fd/<dirfd>/init.sock`` instead, which names
the same place without chdir (process-wide, unsafe with threads).
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

BACKLOG = 128
MAX_SUN_PATH = 107


def listen_at(path: Path) -> socket.socket:
    """A listening socket bound at ``path`` (an old socket file there is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        if len(os.fsencode(path)) <= MAX_SUN_PATH:
            sock.bind(str(path))
        else:
            dir_fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                sock.bind(f"/proc/self/fd/{dir_fd}/{path.name}")
            finally:
                os.close(dir_fd)
        os.chmod(path, 0o600)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock
