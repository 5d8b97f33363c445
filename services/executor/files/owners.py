"""Who a written file belongs to: an owner named by the client, mapped to host ids.

``WriteFileHeader.owner``, ``UploadHeader.owner`` and ``MakeDirRequest.owner``
name a user the way ``ExecStart.user`` does ("agent", "1000", "agent:staff",
"1000:1000"), resolved in the sandbox's own /etc/passwd and /etc/group
(:func:`.users.lookup_user`). The executor is host root and creates files on
the host, so the sandbox's ids are shifted by the sandbox's user-namespace
base (``SandboxMeta.root_uid``): uid 1000 inside is ``base + 1000`` outside.
An id beyond the namespace's range would show as ``nobody`` inside (and
belong to another sandbox's range on the host), so it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchard.common.errors import invalid

from .fserrors import INVALID_FIELD
from .users import lookup_user

# The size of a sandbox's uid/gid range; must match the scheduler's userns RANGE_SIZE
# (services/scheduler/backends/local/userns.py), which the executor may not import.
USERNS_RANGE_SIZE = 65536


@dataclass(frozen=True)
class HostOwner:
    """Host uid and gid to chown new entries to (``ConfinedRoot(owner=, group=)``)."""

    uid: int
    gid: int


def resolve_owner(root: Path, spec: str, base: int) -> HostOwner | None:
    """The host ids for ``spec`` in the sandbox at ``root`` (None for an empty spec).

    ``base`` is the host uid of the sandbox's root (0 without a user namespace).
    Blocking (reads the sandbox's user database): call it on a worker thread.
    """
    if not spec.strip():
        return None
    uid, gid, _home = lookup_user(root, spec)
    if base:
        for what, value in (("uid", uid), ("gid", gid)):
            if value >= USERNS_RANGE_SIZE:
                raise invalid(
                    f"owner {spec!r}: {what} {value} is outside the sandbox's user namespace "
                    f"(ids 0..{USERNS_RANGE_SIZE - 1})",
                    INVALID_FIELD,
                )
    return HostOwner(base + uid, base + gid)
