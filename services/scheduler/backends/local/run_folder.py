"""An injected sandbox's run folder on its own small tmpfs, capped in bytes and inodes.

Why: ``<sandbox>/run`` is bound writable at ``/.orchard/run`` (the executor binds
its socket there and reads, then removes, its token keys), and in a user namespace
it belongs to the sandbox's root. As a plain folder on the home's filesystem it was
a way onto the host's disk past the sandbox's writable-layer cap (``scratch.py``):
the sandbox's root wrote there without bound. Here it is a tmpfs of
:data:`SIZE_BYTES` and :data:`INODES`, mode 0700, owned by that root from the
start, mounted with nosuid, nodev and noexec; a write past the cap ends in
ENOSPC inside the sandbox and puts nothing on the host's disk.

What it must hold: init's and the executor's sockets, ``executor.addr``,
``token.key`` (gone once the executor has read it) and ``sandbox.json`` twice over
while ``update_env`` replaces it (a temp name, then rename). The env is at most
256 KiB (``scheduler/settings.py``); JSON's ``\\uXXXX`` escapes make that at most
1.5 MiB a copy, so two copies fit in :data:`SIZE_BYTES`.

Memory: tmpfs pages are charged to the memory cgroup of the process that writes
them. What the sandbox writes there counts against its own ``memory_bytes``, as
its writable layer does; the host's few KiB (the keys, sandbox.json) go to the
scheduler's cgroup.

Why a host mount: the host (the scheduler, a client on the node) reaches the
executor at ``unix:<home>/sandboxes/<id>/run/executor.sock`` and rewrites
``sandbox.json`` there on a warm-pool claim, after start and after a scheduler
restart, so the folder needs a path in the host's mount table. A detached tmpfs
(``scratch.py``'s way) has none; a tmpfs made by runc in the container's mount
namespace would be reachable only through ``/proc/<pid>/root``, which resolves
through the sandbox's own tree. So it is one more host mount per injected
sandbox, the cost ``scratch.py`` measures for every later ``runc run`` (see
docs/benchmarks.md, "The run folder's tmpfs").

Every injected sandbox gets it (runc and runsc, with a user namespace or without:
then host root owns it); runc sandboxes served by the node executor have no run folder.

Teardown: delete unmounts it (:func:`unmount`) before removing the folder,
whatever state the create was left in: a create that failed or was killed after
the mount, and a scheduler restarted after kill -9 that deletes what it finds.
"""

from __future__ import annotations

import errno
from pathlib import Path

from . import syscalls

SIZE_BYTES = 4 << 20
"""The cap on what the run folder holds (tmpfs ``size=``)."""
INODES = 64
"""The cap on its files (tmpfs ``nr_inodes=``): a handful are the backend's and the executor's."""
MS_NOEXEC = 0x8


def options(owner: int) -> str:
    """The tmpfs's mount options; ``owner``: the host uid and gid its root belongs to."""
    return f"size={SIZE_BYTES},nr_inodes={INODES},mode=0700,uid={owner},gid={owner}"


def mount(run: Path, owner: int | None) -> None:
    """Make ``run`` (it must not exist) and mount the capped tmpfs on it, owned by
    ``owner`` (the sandbox's root in its user namespace; None: host root)."""
    run.mkdir(mode=0o700)
    uid = 0 if owner is None else owner
    flags = syscalls.MS_NOSUID | syscalls.MS_NODEV | MS_NOEXEC
    syscalls.mount("tmpfs", str(run), "tmpfs", flags, options(uid))


def unmount(run: Path) -> None:
    """Unmount the run folder's tmpfs if it is mounted (idempotent, every layer of it);
    detach lazily if something still holds it open."""
    try:
        while syscalls.umount(str(run)):
            pass
    except OSError as err:
        if err.errno != errno.EBUSY:
            raise
        while syscalls.umount(str(run), lazy=True):
            pass
