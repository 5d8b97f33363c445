"""A sandbox's writable layer on its own tmpfs, capped at a size, mounted nowhere.

Why tmpfs: on this kind of VM ext4 creates ~2k files/s, and every create and
delete of a sandbox made and unlinked inodes there (``recently_deleted`` scans
showed in the kernel profile of 1000 concurrent creates; ``rmtree`` of the
upper/work dirs was a quarter of the scheduler's samples). A tmpfs writes at
memory speed and goes away with the overlay. Its ``size=`` is the sandbox's
disk quota: a disk fill inside ends in ENOSPC at the cap.

Why "mounted nowhere": every mount in the host's mount table costs every later
``runc run`` (the new mount namespace copies the table, runc and runc init parse
/proc/self/mountinfo, pivot_root detaches the old root): measured +21 ms of CPU
per create per 1000 host mounts. So the tmpfs is made with the new mount API
(``fsopen``/``fsmount``: a detached mount, in no mount table), the overlay takes
its upper and work dirs by file descriptor (Linux 6.13+), and only the overlay
is attached, at ``rootfs``: one host mount per sandbox, as without tmpfs. The
tmpfs lives as long as the overlay does; unmounting the overlay frees it.

The trade-off: tmpfs pages are memory, charged to the memory cgroup of the
process that writes them, i.e. to the sandbox's own ``memory_bytes`` (measured
in docs/benchmarks.md, "The writable layer's tmpfs, observed"): files count against the
sandbox's memory limit and cannot use the node's memory beyond it.
``sandbox_disk_bytes = 0`` keeps upper/work on the home's filesystem instead.

Older kernels (before 6.13: Debian 12 and 13, Ubuntu 22.04 and 24.04) refuse
the overlay's layers by descriptor. There the backend falls back by itself to
the classic way: the same tmpfs, with the same ``size=`` cap and the same
memory-cgroup charge, mounted with mount(2) at ``sandboxes/<id>/scratch``
(nosuid, nodev, mode 0700, inside the 0700 sandbox folder), and the overlay
over it by path. Isolation is unchanged (the sandbox sees only its overlay; the
tmpfs is dropped from its mount namespace with the host's root at pivot_root);
the cost is a second host mount per sandbox, which every later ``runc run``
pays for (see above). :func:`choose` decides once at start, by probing, and
``ORCHARD_SCRATCH_MOUNT`` (``settings.scratch_mount_from_env``) can force
either way; the choice is logged once and written to ``run/writable-layer.json``
for ``orchard up`` to print.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from . import overlay, syscalls, userns

DETACHED = "detached"
"""tmpfs made with fsopen/fsmount, mounted nowhere; the overlay takes its dirs by fd (6.13+)."""
MOUNTED = "mounted"
"""The fallback: tmpfs mounted at ``sandboxes/<id>/scratch``, the overlay over it by path."""
ON_DISK = "disk"
"""``sandbox_disk_bytes = 0``: upper/work on the home's filesystem, no per-sandbox cap."""
AUTO = "auto"
"""Choose by probing: DETACHED where the kernel has it, else MOUNTED."""
SCRATCH_MOUNTS = (AUTO, DETACHED, MOUNTED)
"""The values ``ORCHARD_SCRATCH_MOUNT`` takes."""

WRITABLE_LAYER_FILE = "writable-layer.json"
"""In the node's ``run/``: the choice of this start, for ``orchard up`` to show."""
SCRATCH_DIR = "scratch"
"""The MOUNTED tmpfs's mount point inside the sandbox folder."""


def mount_overlay_on_tmpfs(
    rootfs: Path, lower_layers: list[Path], size_bytes: int, userns_fd: int = -1, root_uid: int = 0
) -> None:
    """Mount at ``rootfs`` an overlay of ``lower_layers`` (lowest first) whose upper and
    work dirs are on a fresh, detached tmpfs of ``size_bytes``.

    ``userns_fd`` (a sandbox's user namespace, ``userns.py``): the layers are
    idmapped through it (detached clones, nothing copied) and the root belongs to
    ``root_uid``, the host uid of the sandbox's root."""
    fds: list[int] = []
    try:
        tmpfs = syscalls.fsopen("tmpfs")
        fds.append(tmpfs)
        syscalls.fsconfig_string(tmpfs, "size", str(size_bytes))
        syscalls.fsconfig_string(tmpfs, "mode", "0700")
        syscalls.fsconfig_create(tmpfs)
        scratch = syscalls.fsmount(tmpfs)
        fds.append(scratch)
        layer_fds = {}
        for name in ("upper", "work"):
            os.mkdir(name, 0o755, dir_fd=scratch)
            layer_fds[name] = os.open(name, os.O_PATH | os.O_DIRECTORY, dir_fd=scratch)
            fds.append(layer_fds[name])
        if userns_fd >= 0:
            os.chown("upper", root_uid, root_uid, dir_fd=scratch)
        overlay = syscalls.fsopen("overlay")
        fds.append(overlay)
        for layer in reversed(lower_layers):  # overlayfs wants the top layer first
            if userns_fd >= 0:
                fds.append(userns.idmapped_tree(layer, userns_fd))
                syscalls.fsconfig_fd(overlay, "lowerdir+", fds[-1])
            else:
                syscalls.fsconfig_string(overlay, "lowerdir+", str(layer))
        syscalls.fsconfig_fd(overlay, "upperdir", layer_fds["upper"])
        syscalls.fsconfig_fd(overlay, "workdir", layer_fds["work"])
        syscalls.fsconfig_flag(overlay, "volatile")
        syscalls.fsconfig_create(overlay)
        mounted = syscalls.fsmount(overlay)
        fds.append(mounted)
        syscalls.move_mount(mounted, str(rootfs))
    finally:
        for fd in fds:
            os.close(fd)


def scratch_dir(sandbox_dir: Path) -> Path:
    return sandbox_dir / SCRATCH_DIR


def mount_overlay_on_mounted_tmpfs(
    rootfs: Path, scratch: Path, lower_layers: list[Path], size_bytes: int
) -> None:
    """The fallback of :func:`mount_overlay_on_tmpfs` for kernels before 6.13: the same
    capped tmpfs, mounted at ``scratch`` (a second host mount), the overlay over it by path."""
    scratch.mkdir(mode=0o700)
    syscalls.mount(
        "tmpfs",
        str(scratch),
        "tmpfs",
        syscalls.MS_NOSUID | syscalls.MS_NODEV,
        f"size={size_bytes},mode=0700",
    )
    try:
        upper, work = scratch / "upper", scratch / "work"
        for folder in (upper, work):
            folder.mkdir(mode=0o755)
        overlay.mount_overlay(rootfs, lower_layers, upper, work)
    except BaseException:
        overlay.unmount_overlay(scratch)
        raise


def unmount_scratch(sandbox_dir: Path) -> None:
    """Unmount a MOUNTED sandbox's tmpfs (after its overlay); nothing to do for the others."""
    scratch = scratch_dir(sandbox_dir)
    if scratch.exists():
        overlay.unmount_overlay(scratch)


class ScratchUnsupported(RuntimeError):
    """This kernel cannot give sandboxes a tmpfs writable layer the way we mount it."""


@dataclass(frozen=True)
class WritableLayer:
    """Where this node's sandboxes write, chosen once at start (:func:`choose`)."""

    kind: str
    """DETACHED, MOUNTED or ON_DISK."""
    size_bytes: int
    """The per-sandbox cap (tmpfs ``size=``); 0 = none."""
    kernel: str
    why: str = ""
    """Why MOUNTED was chosen (the kernel's refusal, or the setting that forced it)."""

    @property
    def summary(self) -> str:
        """One line for people (``orchard up`` prints it)."""
        mib = self.size_bytes >> 20
        if self.kind == DETACHED:
            return (
                f"tmpfs per sandbox, {mib} MiB cap enforced, mounted nowhere (Linux {self.kernel})"
            )
        if self.kind == MOUNTED:
            return (
                f"FALLBACK: tmpfs per sandbox mounted on the host, {mib} MiB cap enforced, "
                f"one more host mount per sandbox (slower creates at scale); {self.why}"
            )
        return "upper dirs on the home's filesystem, NO per-sandbox disk cap (sandbox_disk_bytes=0)"

    def write(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f"{WRITABLE_LAYER_FILE}.tmp"
        tmp.write_text(json.dumps({**asdict(self), "summary": self.summary}) + "\n")
        tmp.replace(run_dir / WRITABLE_LAYER_FILE)


def choose(size_bytes: int, wanted: str, work_dir: Path) -> WritableLayer:
    """The writable layer this kernel gives sandboxes, probed once under ``work_dir``.

    ``wanted`` is AUTO (DETACHED if the kernel takes it, else MOUNTED), DETACHED
    (refuse to start without it) or MOUNTED (the fallback, forced: what the tests
    of old kernels use). Raises :class:`ScratchUnsupported` saying what to do when
    the kernel takes neither.
    """
    kernel = os.uname().release
    if not size_bytes:
        return WritableLayer(ON_DISK, 0, kernel)
    if wanted not in SCRATCH_MOUNTS:
        raise ScratchUnsupported(
            f"ORCHARD_SCRATCH_MOUNT={wanted!r}: expected one of {', '.join(SCRATCH_MOUNTS)}"
        )
    why = f"forced by ORCHARD_SCRATCH_MOUNT={MOUNTED}"
    if wanted != MOUNTED:
        try:
            _probe(work_dir, DETACHED)
            return WritableLayer(DETACHED, size_bytes, kernel)
        except OSError as err:
            if wanted == DETACHED:
                raise ScratchUnsupported(
                    f"ORCHARD_SCRATCH_MOUNT={DETACHED} needs Linux 6.13+ (overlayfs layers passed "
                    f"by file descriptor); this kernel is {kernel} and refused it: {err}. Unset "
                    f"it to fall back to a mounted tmpfs."
                ) from err
            why = f"kernel {kernel} has no detached tmpfs layers (needs 6.13+: {err.strerror})"
    try:
        _probe(work_dir, MOUNTED)
    except OSError as err:
        raise ScratchUnsupported(
            f"per-sandbox tmpfs writable layers: this kernel ({kernel}) refused both the "
            f"detached and the mounted tmpfs under an overlay: {err}. Set "
            "ORCHARD_SANDBOX_DISK_BYTES=0 to keep sandboxes' upper dirs on the home's "
            "filesystem (then without a per-sandbox disk quota)."
        ) from err
    return WritableLayer(MOUNTED, size_bytes, kernel, why)


def _probe(work_dir: Path, kind: str) -> None:
    """Mount and unmount one tiny overlay-on-tmpfs of ``kind`` under ``work_dir``, so an
    old kernel is found here, once, not on every create with a bare errno."""
    probe = work_dir / ".scratch-probe"
    lower, target = probe / "lower", probe / "root"
    for folder in (lower, target):
        folder.mkdir(parents=True, exist_ok=True)
    try:
        if kind == DETACHED:
            mount_overlay_on_tmpfs(target, [lower], 1 << 20)
        else:
            mount_overlay_on_mounted_tmpfs(target, scratch_dir(probe), [lower], 1 << 20)
        overlay.unmount_overlay(target)
    finally:
        unmount_scratch(probe)
        for folder in (scratch_dir(probe), lower, target, probe):
            if folder.exists():
                folder.rmdir()
