"""The sandbox's writable layer on its own tmpfs (``scratch.py``), real runc.

The detached tmpfs (Linux 6.13+), asked for by name so the test means the same on
every kernel (the old-kernel fallback has its own: ``test_scratch_fallback``).
What must hold: one host mount per sandbox (the overlay; the tmpfs is detached),
writes stop with ENOSPC at ``sandbox_disk_bytes``, what a sandbox writes is
charged to its own memory cgroup, the image layers stay untouched, and a
delete leaves no mount. ``sandbox_disk_bytes = 0`` keeps upper/work in the
sandbox folder.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeAlias

import pytest
from orchard.scheduler.backends import SandboxSpec
from orchard.scheduler.backends.local import scratch
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.settings import LocalSettings
from orchard.scheduler.backends.netpolicy.policy import NetworkPolicySpec

from orchard.common.layout import SandboxMeta
from tests.cgroup_paths import sandbox_cgroup

from .runtime_helpers import init_exec, kernel_at_least, mounts_under, nsenter

Run: TypeAlias = Callable[[Awaitable[Any]], Any]
MIB = 1 << 20


def spec(sandbox_id: str) -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=sandbox_id,
        image="",
        cpu_millis=1000,
        memory_bytes=512 * MIB,
        pids=256,
        env={},
        network_mode="none",
        network=NetworkPolicySpec(),
    )


def _usage(sandbox_id: str) -> int:
    """The sandbox's shared-memory (tmpfs) pages: what a file in the tmpfs is charged as.

    Not ``memory.usage_in_bytes``: its delta also counts the sandbox's other pages, which
    the kernel may reclaim while the file is written (seen: 20 MiB written, 17.8 MiB more
    in use), so it can read less than the file's own charge."""
    stat = (sandbox_cgroup("memory", sandbox_id) / "memory.stat").read_text()
    fields = dict(line.split() for line in stat.splitlines() if line.count(" ") == 1)
    return int(fields["total_shmem"])


def test_tmpfs_layer_is_capped_charged_to_the_sandbox_and_mounted_nowhere(
    settings: LocalSettings,
    run: Run,
    home: Path,
    images_dir: Path,
    loop: Any,
) -> None:
    if not kernel_at_least(6, 13):
        pytest.skip("the detached tmpfs needs Linux 6.13+; this kernel gets the fallback")
    backend = LocalBackend(
        replace(settings, sandbox_disk_bytes=64 * MIB, scratch_mount=scratch.DETACHED)
    )
    try:
        made = run(backend.create(spec("tmpfs-1")))
        # Only the overlay is in the host's mount table: the tmpfs is detached.
        assert [m.rsplit("/", 1)[-1] for m in mounts_under(home)] == ["rootfs"]
        sock = home / "sandboxes/tmpfs-1/init.sock"
        env = SandboxMeta.from_json((home / "sandboxes/tmpfs-1/sandbox.json").read_text()).env
        before = _usage("tmpfs-1")
        # Through orchard-init: the command runs in the sandbox's cgroups, as an exec would.
        code, _ = init_exec(sock, ["sh", "-c", "head -c 20971520 /dev/zero > /root/twenty"], env)
        charged = _usage("tmpfs-1") - before
        assert code == 0 and charged >= 18 * MIB, f"20 MiB written, {charged} bytes charged"
        code, out = init_exec(
            sock, ["sh", "-c", "head -c 134217728 /dev/zero 2>&1 >/root/big; echo rc=$?"], env
        )
        assert b"No space left" in out and b"rc=0" not in out, out
        size = int(nsenter(made.init_pid, "stat", "-c", "%s", "/root/big").strip())
        assert 30 * MIB < size <= 64 * MIB
        assert not (images_dir / "debian+bookworm/layers/0/root/big").exists()
        assert not (home / "sandboxes/tmpfs-1/upper").exists()
        run(backend.delete("tmpfs-1"))
        assert mounts_under(home) == []
        assert not (home / "sandboxes/tmpfs-1").exists()
    finally:
        loop.run_until_complete(backend.close())


@pytest.mark.parametrize("disk", [0])
def test_without_tmpfs_upper_and_work_live_in_the_folder(
    settings: LocalSettings, run: Run, home: Path, loop: Any, disk: int
) -> None:
    # Upper/work on disk: no detached layer, so no user namespaces (they need one).
    backend = LocalBackend(replace(settings, sandbox_disk_bytes=disk, userns=False))
    try:
        made = run(backend.create(spec("disk-1")))
        nsenter(made.init_pid, "sh", "-c", "echo kept > /root/file")
        assert (home / "sandboxes/disk-1/upper/root/file").read_text() == "kept\n"
        run(backend.delete("disk-1"))
        assert mounts_under(home) == []
        assert not (home / "sandboxes/disk-1").exists()
    finally:
        loop.run_until_complete(backend.close())
