"""The start-up choice of the sandboxes' writable layer (``scratch.choose``), real mounts.

This machine's kernel may have the detached-tmpfs API (6.13+); the old-kernel
path is proven by forcing it (``mounted``) and, for the choice itself, by making
the detached probe fail as an older kernel does (EINVAL from fsconfig).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from orchard.scheduler.backends.local import scratch

from .runtime_helpers import kernel_at_least, mounts_under

pytestmark = pytest.mark.runc  # mounts: needs root

MIB = 1 << 20


def _refuse(*_args: object) -> None:
    raise OSError(errno.EINVAL, "fsconfig upperdir (fd): Invalid argument")


@pytest.mark.skipif(not kernel_at_least(6, 13), reason="this kernel predates 6.13")
def test_auto_takes_the_detached_tmpfs_here_and_leaves_nothing(tmp_path: Path) -> None:
    layer = scratch.choose(64 * MIB, scratch.AUTO, tmp_path)
    assert (layer.kind, layer.size_bytes, layer.why) == (scratch.DETACHED, 64 * MIB, "")
    assert list(tmp_path.iterdir()) == [] and mounts_under(tmp_path) == []


def test_forced_mounted_probes_the_classic_tmpfs_and_leaves_nothing(tmp_path: Path) -> None:
    layer = scratch.choose(64 * MIB, scratch.MOUNTED, tmp_path)
    assert layer.kind == scratch.MOUNTED
    assert "ORCHARD_SCRATCH_MOUNT=mounted" in layer.why
    assert "FALLBACK" in layer.summary and "64 MiB cap enforced" in layer.summary
    assert list(tmp_path.iterdir()) == [] and mounts_under(tmp_path) == []


def test_an_old_kernel_falls_back_by_itself_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scratch, "mount_overlay_on_tmpfs", _refuse)
    layer = scratch.choose(64 * MIB, scratch.AUTO, tmp_path)
    assert layer.kind == scratch.MOUNTED
    assert "no detached tmpfs layers (needs 6.13+: fsconfig upperdir (fd): Invalid" in layer.why
    assert list(tmp_path.iterdir()) == [] and mounts_under(tmp_path) == []
    layer.write(tmp_path / "run")
    written = json.loads((tmp_path / "run" / scratch.WRITABLE_LAYER_FILE).read_text())
    assert written["kind"] == scratch.MOUNTED and written["summary"] == layer.summary


def test_detached_on_demand_refuses_an_old_kernel_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scratch, "mount_overlay_on_tmpfs", _refuse)
    with pytest.raises(
        scratch.ScratchUnsupported, match=r"needs Linux 6\.13.*Unset it to fall back"
    ):
        scratch.choose(64 * MIB, scratch.DETACHED, tmp_path)


def test_a_kernel_refusing_both_gets_a_message_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scratch, "mount_overlay_on_tmpfs", _refuse)
    monkeypatch.setattr(scratch, "mount_overlay_on_mounted_tmpfs", _refuse)
    with pytest.raises(scratch.ScratchUnsupported, match="ORCHARD_SANDBOX_DISK_BYTES=0"):
        scratch.choose(64 * MIB, scratch.AUTO, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_no_cap_needs_no_probe_and_an_unknown_setting_is_refused(tmp_path: Path) -> None:
    assert scratch.choose(0, scratch.MOUNTED, tmp_path).kind == scratch.ON_DISK
    with pytest.raises(scratch.ScratchUnsupported, match="expected one of auto, detached, mounted"):
        scratch.choose(MIB, "bind", tmp_path)
