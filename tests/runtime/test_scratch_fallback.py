"""Kernels before 6.13: the local backend's fallback writable layer, forced here, real runc.

``ORCHARD_SCRATCH_MOUNT=mounted`` (read once, in ``LocalSettings``) makes the
backend take the old-kernel path on any kernel: the per-sandbox tmpfs is
mounted on the host at ``sandboxes/<id>/scratch`` and the overlay sits on it by
path. What must still hold, as with the detached tmpfs (``test_sandbox_tmpfs``):
the disk cap ends in ENOSPC, the writes are charged to the sandbox's own memory
cgroup, the image stays untouched, programs written there run, one sandbox sees
nothing of another's layer or of the host's tmpfs, and a delete leaves nothing
(no mount, folder, cgroup, runc state or process).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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

from .runtime_helpers import Footprint, init_exec, mounts_under

Run: TypeAlias = Callable[[Awaitable[Any]], Any]
MIB = 1 << 20


def spec(sandbox_id: str) -> SandboxSpec:
    return SandboxSpec(
        sandbox_id=sandbox_id,
        memory_bytes=512 * MIB,
        pids=256,
        network_mode="none",
        network=NetworkPolicySpec(),
    )


def _usage(sandbox_id: str) -> int:
    return int((sandbox_cgroup("memory", sandbox_id) / "memory.usage_in_bytes").read_text())


@pytest.fixture
def forced(settings: LocalSettings, monkeypatch: pytest.MonkeyPatch, loop: Any) -> Any:
    monkeypatch.setenv("ORCHARD_SCRATCH_MOUNT", "mounted")
    monkeypatch.setenv("ORCHARD_SANDBOX_DISK_BYTES", str(64 * MIB))
    # User namespaces need the detached layer; the old-kernel fallback runs without them.
    monkeypatch.setenv("ORCHARD_USERNS", "0")
    # Built the way the scheduler builds it (the env read by the settings' defaults).
    backend = LocalBackend(
        LocalSettings(
            home=settings.home, images_dir=settings.images_dir, init_binary=settings.init_binary
        )
    )
    try:
        yield backend
    finally:
        loop.run_until_complete(backend.close())


def test_forced_fallback_runs_sandboxes_capped_isolated_and_leaves_nothing(
    forced: LocalBackend, run: Run, home: Path, images_dir: Path
) -> None:
    layer = forced.writable_layer
    assert (layer.kind, layer.size_bytes) == (scratch.MOUNTED, 64 * MIB)
    assert "FALLBACK" in (home / "run" / scratch.WRITABLE_LAYER_FILE).read_text()

    made = {i: run(forced.create(spec(i))) for i in ("old-1", "old-2")}
    footprints = {i: Footprint.of(home, i, m.init_pid) for i, m in made.items()}
    # Two host mounts per sandbox now: the overlay and the tmpfs under it.
    assert sorted(m.removeprefix(f"{home}/sandboxes/") for m in mounts_under(home)) == [
        "old-1/rootfs",
        "old-1/scratch",
        "old-2/rootfs",
        "old-2/scratch",
    ]

    def sh(sandbox_id: str, script: str) -> tuple[int, bytes]:
        sandbox = home / "sandboxes" / sandbox_id
        env = SandboxMeta.from_json((sandbox / "sandbox.json").read_text()).env
        return init_exec(sandbox / "init.sock", ["sh", "-c", script], env)

    # Write, then read back; the file lives on the sandbox's tmpfs, not in the image.
    assert sh("old-1", "echo kept > /root/file && cat /root/file") == (0, b"kept\n")
    assert (home / "sandboxes/old-1/scratch/upper/root/file").read_text() == "kept\n"
    assert not (images_dir / "debian+bookworm/layers/0/root/file").exists()
    assert not (home / "sandboxes/old-1/upper").exists()
    # A program written there runs (the host mount's nosuid/nodev do not reach the sandbox).
    code, out = sh(
        "old-1", "printf '#!/bin/sh\\necho ran\\n' > /root/p && chmod +x /root/p && /root/p"
    )
    assert (code, out) == (0, b"ran\n")
    # The other sandbox sees none of it, and neither has the host's tmpfs in its mount
    # table (only its overlay root, whose options name host paths in either mode).
    assert sh("old-2", "cat /root/file 2>/dev/null; echo rc=$?")[1] == b"rc=1\n"
    for sandbox_id, m in made.items():
        lines = Path(f"/proc/{m.init_pid}/mountinfo").read_text().splitlines()
        points = [line.split(" ")[4] for line in lines]
        assert not any(str(home) in p or "scratch" in p for p in points), (sandbox_id, points)

    # Charged to the writer's own memory cgroup, and capped at the size.
    before = _usage("old-1")
    assert sh("old-1", "head -c 20971520 /dev/zero > /root/twenty")[0] == 0
    charged = _usage("old-1") - before
    assert charged >= 18 * MIB, f"20 MiB written, {charged} bytes charged"
    code, out = sh("old-1", "head -c 134217728 /dev/zero 2>&1 >/root/big; echo rc=$?")
    assert b"No space left" in out and b"rc=0" not in out, out

    for sandbox_id in made:
        run(forced.delete(sandbox_id))
        assert footprints[sandbox_id].leftovers() == []
    assert mounts_under(home) == []
    assert list((home / "sandboxes").iterdir()) == []


def test_a_restarted_backend_removes_a_fallback_sandbox_it_finds(
    forced: LocalBackend, run: Run, home: Path, settings: LocalSettings, loop: Any
) -> None:
    made = run(forced.create(spec("old-crash")))
    footprint = Footprint.of(home, "old-crash", made.init_pid)
    # The scheduler dies; a new one (same forced setting) finds and deletes the sandbox.
    restarted = LocalBackend(
        LocalSettings(
            home=settings.home, images_dir=settings.images_dir, init_binary=settings.init_binary
        )
    )
    try:
        assert [s.sandbox_id for s in run(restarted.list())] == ["old-crash"]
        run(restarted.delete("old-crash"))
    finally:
        loop.run_until_complete(restarted.close())
    assert footprint.leftovers() == [] and mounts_under(home) == []
