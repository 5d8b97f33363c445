"""The start-up check for per-sandbox tmpfs writable layers (scratch.check_supported)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from orchard.scheduler.backends.local import overlay, scratch

pytestmark = pytest.mark.runc  # mounts: needs root


def test_probe_passes_here_and_leaves_nothing(tmp_path: Path) -> None:
    scratch.check_supported(tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert not overlay.is_mounted(tmp_path / ".scratch-probe" / "root")


def test_old_kernel_gets_a_message_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_args: object) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(scratch, "mount_overlay_on_tmpfs", refuse)
    with pytest.raises(scratch.ScratchUnsupported, match="ORCHARD_SANDBOX_DISK_BYTES=0"):
        scratch.check_supported(tmp_path)
