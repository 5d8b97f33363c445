"""Confined, streaming file transfer for the node executor.

Everything here works on a sandbox's rootfs from the host, as root, with
paths from clients and a tree shaped by the sandbox's own code, so every
lookup is confined with openat2 (see :mod:`.confined`). The gRPC servicer
uses :class:`SandboxFiles`; exec uses :func:`lookup_user`.
"""

from __future__ import annotations

from .api import SandboxFiles
from .bridge import TransferAborted
from .users import lookup_user

__all__ = ["SandboxFiles", "TransferAborted", "lookup_user"]
