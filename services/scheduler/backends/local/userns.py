"""User namespaces for sandboxes: one unprivileged host uid range per sandbox.

Why: without a user namespace, sandbox root is host uid 0, and every per-uid
kernel limit (inotify instances, user namespaces, ...) is shared by all sandboxes
and by the host's root: one sandbox taking all 128 inotify instances left every
other sandbox and host root with EMFILE.

On by default for sandboxes runc runs (``ORCHARD_USERNS`` unset): runtime classes
``runc`` and ``injected`` (the injected executor runs as the sandbox's root, so its
run folder and init's socket are given to the range's first uid, and the bundle is
reached through the sandbox folder like the init binary). ``runsc`` sandboxes run
without one (runsc's own namespace handling was never mapped; gVisor's Sentry keeps
the sandbox's per-uid counts in its own kernel), which the scheduler logs once at
start and docs/architecture.md states. ``ORCHARD_USERNS=1`` requires a namespace for
every sandbox (a runsc create is then refused, INVALID_ARGUMENT UNSUPPORTED);
``ORCHARD_USERNS=0`` turns them off (sandbox root is host root again).
A node that cannot run them (no detached tmpfs writable layer) refuses to start and
says to set ``ORCHARD_USERNS=0``.

What each sandbox gets: ``RANGE_SIZE`` host ids from
``uid_base + index * RANGE_SIZE`` (:class:`UidRanges`: one claim file per index
under ``run/uid-ranges``, made with O_EXCL so two creates never share one, removed
on delete, read back after a restart), and a user namespace mapping 0..65535 in
the sandbox to that range.

Why we create the namespace ourselves (:func:`sandbox_userns`) instead of letting
runc make it: the kernel charges a namespace's per-uid counts also to the uid that
*created* it, in the parent namespace (``inc_ucount`` walks up the chain). A
namespace made by runc (host root) would still charge every sandbox's inotify
instances to host root. So a short-lived child drops to the range's first host uid
and unshares; we write its maps; runc joins it by path; the namespace then belongs
to that unprivileged uid and its counts stop there.

The same namespace fd idmaps the image layers (``open_tree`` + ``mount_setattr``
``MOUNT_ATTR_IDMAP``, see ``scratch.mount_overlay_on_tmpfs``): the shared layers are
never copied or chowned, the overlay sees them owned by the range. runc 1.1 has no
idmapped mounts of its own, hence done here, before runc.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base import BackendError
from . import syscalls

RANGE_SIZE = 65536
DEFAULT_UID_BASE = 1 << 30
DEFAULT_RANGES = 16384
CLAIMS_DIR = "uid-ranges"
RANGE_FILE = "uid-range"
"""In the sandbox folder: the index of its range (the claim file says which sandbox)."""


def _setting() -> str:
    raw = os.environ.get("ORCHARD_USERNS", "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"ORCHARD_USERNS must be 0 or 1 (or unset), not {raw!r}")
    return raw


def enabled_from_env() -> bool:
    """``ORCHARD_USERNS``: unset (the default) or "1": runc sandboxes run in user
    namespaces; "0": none does (sandbox root is host root)."""
    return _setting() != "0"


def required_from_env() -> bool:
    """``ORCHARD_USERNS=1``: every sandbox must run in one; the runtime class that cannot
    (runsc) is refused instead of running without."""
    return _setting() == "1"


def _int_from_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be > 0")
    return value


def uid_base_from_env() -> int:
    """``ORCHARD_USERNS_UID_BASE``: the first host uid of the first range."""
    return _int_from_env("ORCHARD_USERNS_UID_BASE", DEFAULT_UID_BASE)


def ranges_from_env() -> int:
    """``ORCHARD_USERNS_RANGES``: how many ranges (sandboxes at once) the node has."""
    return _int_from_env("ORCHARD_USERNS_RANGES", DEFAULT_RANGES)


@dataclass(frozen=True)
class UidRange:
    index: int
    host_base: int
    size: int = RANGE_SIZE

    @property
    def mapping(self) -> list[dict[str, int]]:
        """The OCI uidMappings/gidMappings entry."""
        return [{"containerID": 0, "hostID": self.host_base, "size": self.size}]


@dataclass
class UidRanges:
    """Claims of host uid ranges, one file per claimed index (``run/uid-ranges/<index>``).

    The files are the truth (a restarted scheduler reads them back); the in-memory
    hint only says where to start looking.
    """

    claims: Path
    uid_base: int
    count: int
    _next: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.uid_base + self.count * RANGE_SIZE > 2**32 - 2:
            raise ValueError(
                f"{self.count} uid ranges of {RANGE_SIZE} from {self.uid_base} pass the "
                "largest uid (2^32 - 2)"
            )
        self.claims.mkdir(parents=True, exist_ok=True, mode=0o700)

    def range_of(self, index: int) -> UidRange:
        return UidRange(index, self.uid_base + index * RANGE_SIZE)

    def claim(self, sandbox_dir: Path) -> UidRange:
        """Claim a free range for the sandbox in ``sandbox_dir`` and note it there."""
        sandbox_id = sandbox_dir.name
        for step in range(self.count):
            index = (self._next + step) % self.count
            try:
                fd = os.open(self.claims / str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as out:
                out.write(sandbox_id)
            self._next = index + 1
            (sandbox_dir / RANGE_FILE).write_text(str(index))
            return self.range_of(index)
        raise BackendError(
            "RESOURCE_EXHAUSTED",
            f"all {self.count} user-namespace uid ranges of this node are in use "
            "(ORCHARD_USERNS_RANGES)",
        )

    def of_sandbox(self, sandbox_dir: Path) -> UidRange | None:
        """The range the sandbox in ``sandbox_dir`` holds, None if it holds none."""
        try:
            index = int((sandbox_dir / RANGE_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return self.range_of(index)

    def release_index(self, index: int, sandbox_id: str) -> None:
        """Free range ``index`` (idempotent; only a claim naming ``sandbox_id`` is removed)."""
        claim = self.claims / str(index)
        with contextlib.suppress(FileNotFoundError):
            if claim.read_text() == sandbox_id:
                claim.unlink()

    def recover(self, sandboxes: Path) -> None:
        """After a restart: drop claims whose sandbox folder is gone (a create killed
        between the claim and the folder, or a delete killed after the folder)."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.claims):
                with contextlib.suppress(OSError):
                    owner = Path(entry.path).read_text()
                    if not owner or not (sandboxes / owner).is_dir():
                        os.unlink(entry.path)


SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
CAT = shutil.which("cat") or "/bin/cat"
USERNS_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class HeldUserns:
    """A user namespace kept alive by a parked child (``path`` for runc) and an fd."""

    pid: int
    fd: int

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/ns/user"


@contextlib.contextmanager
def sandbox_userns(uid_range: UidRange) -> Iterator[HeldUserns]:
    """A new user namespace owned by ``uid_range.host_base`` with 0.. mapped onto the range.

    A child becomes the range's first uid/gid (``setpriv``; so the kernel counts the
    namespace and everything inside it against that uid, not host root), runs
    ``unshare --user cat``: it unshares, then parks on its stdin while runc joins its
    namespace; it is gone on exit. Why util-linux programs and not ``os.fork`` +
    unshare(2), or Popen(user=...): those fork() for real, and gRPC's fork handlers
    then start threads in the child (the kernel refuses CLONE_NEWUSER to a
    multithreaded process: EINVAL) or crash in it; a plain Popen spawns with vfork,
    which runs no fork handlers.
    """
    own = os.stat("/proc/self/ns/user").st_ino
    ids = str(uid_range.host_base)
    child = subprocess.Popen(
        [SETPRIV, "--reuid", ids, "--regid", ids, "--clear-groups", UNSHARE, "--user", CAT],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        close_fds=True,
    )
    fd = -1
    try:
        _wait_unshared(child, own, uid_range)
        line = f"0 {uid_range.host_base} {uid_range.size}\n"
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child.pid}/{name}", "w", encoding="ascii") as out:
                out.write(line)
        fd = os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        yield HeldUserns(child.pid, fd)
    finally:
        if fd >= 0:
            os.close(fd)
        if child.stdin is not None:
            child.stdin.close()  # cat reads EOF and exits
        try:
            child.wait(USERNS_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stderr is not None:
            child.stderr.close()


def _wait_unshared(child: subprocess.Popen[bytes], own_ns: int, uid_range: UidRange) -> None:
    """Wait until ``child`` is in a user namespace of its own (unshare(1) has run)."""
    deadline = time.monotonic() + USERNS_WAIT_SECONDS
    while time.monotonic() < deadline:
        if child.poll() is not None:
            err = child.stderr.read().decode(errors="replace") if child.stderr else ""
            raise BackendError.failure(
                f"could not create a user namespace as host uid {uid_range.host_base}: "
                f"{err.strip() or f'unshare exited {child.returncode}'}"
            )
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if os.stat(f"/proc/{child.pid}/ns/user").st_ino != own_ns:
                return
        time.sleep(0.0005)
    raise BackendError.failure(
        f"user namespace for host uid {uid_range.host_base}: unshare did not run within "
        f"{USERNS_WAIT_SECONDS:.0f}s"
    )


def idmapped_tree(path: Path, userns_fd: int) -> int:
    """A detached clone of the mount at ``path``, idmapped through ``userns_fd``."""
    fd = syscalls.open_tree(str(path))
    try:
        syscalls.mount_setattr_idmap(fd, userns_fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


REACHABLE_ROOT = Path("/run/orchard-userns")
"""Where a sandbox's folder is bound while runc starts it (see :func:`reachable_bundle`)."""
INIT_IN_BUNDLE = "orchard-init"
"""In the sandbox folder, while runc starts: the mount point of the init binary's bind."""
EXECUTOR_BUNDLE_IN_FOLDER = "orchard-bundle"
"""In the sandbox folder, while runc starts an injected sandbox: the executor bundle's bind."""


@contextlib.contextmanager
def reachable_bundle(
    sandbox_dir: Path, init_binary: Path, executor_bundle: Path | None = None
) -> Iterator[Path]:
    """The sandbox's folder (with its rootfs mount) bound at ``/run/orchard-userns/<id>``
    for as long as runc starts the sandbox; yields that path.

    Why: runc mounts the root and the bind sources from inside the sandbox's user
    namespace, as a uid the host does not know, so every folder on those paths must
    be searchable by others. The home's own parents need not be (pytest's tmp dirs,
    /root are 0700), and we do not chmod an operator's folders: the paths runc sees
    go through ``/run/orchard-userns`` (0711) instead. The sandbox folder itself is
    0710 with the range's gid (the caller set that). The init binary (in the home)
    is bound onto a file in the folder first, so the same recursive clone carries it;
    so is an injected sandbox's executor bundle (``executor_bundle``), onto a folder.
    After ``runc run`` the bind goes: the sandbox has pivoted into its root, and its
    mount namespace keeps its own copy of what it mounted.
    """
    REACHABLE_ROOT.mkdir(mode=0o711, exist_ok=True)
    if REACHABLE_ROOT.stat().st_mode & 0o001 == 0:
        REACHABLE_ROOT.chmod(0o711)
    init_target = sandbox_dir / INIT_IN_BUNDLE
    alias = REACHABLE_ROOT / sandbox_dir.name
    init_target.touch(mode=0o500)
    mounted: list[Path] = []
    try:
        fd = syscalls.open_tree(str(init_binary))
        try:
            syscalls.move_mount(fd, str(init_target))
        finally:
            os.close(fd)
        mounted.append(init_target)
        if executor_bundle is not None:
            bundle_target = sandbox_dir / EXECUTOR_BUNDLE_IN_FOLDER
            bundle_target.mkdir(mode=0o500, exist_ok=True)
            fd = syscalls.open_tree(str(executor_bundle), recursive=True)
            try:
                syscalls.move_mount(fd, str(bundle_target))
            finally:
                os.close(fd)
            mounted.append(bundle_target)
        alias.mkdir(mode=0o700, exist_ok=True)
        fd = syscalls.open_tree(str(sandbox_dir), recursive=True)
        try:
            syscalls.move_mount(fd, str(alias))
        finally:
            os.close(fd)
        mounted.append(alias)
        yield alias
    finally:
        for path in reversed(mounted):
            with contextlib.suppress(OSError):
                syscalls.umount(str(path), lazy=True)
        drop_reachable(sandbox_dir)


def drop_reachable(sandbox_dir: Path) -> None:
    """Remove what :func:`reachable_bundle` made for the sandbox in ``sandbox_dir``: the
    bind at ``/run/orchard-userns/<id>`` and the init binary's bind in the folder
    (idempotent; delete calls it, since a create killed while runc ran leaves both, and
    the folder cannot be removed with a mount in it)."""
    alias = REACHABLE_ROOT / sandbox_dir.name
    init_target = sandbox_dir / INIT_IN_BUNDLE
    bundle_target = sandbox_dir / EXECUTOR_BUNDLE_IN_FOLDER
    for path in (alias, init_target, bundle_target):
        with contextlib.suppress(OSError):
            while syscalls.umount(str(path), lazy=True):
                pass
    for folder in (alias, bundle_target):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        init_target.unlink()


def reroute(
    config: dict[str, Any],
    sandbox_dir: Path,
    init_binary: Path,
    executor_bundle: Path | None = None,
) -> None:
    """Point the OCI config's root and bind sources that lie in ``sandbox_dir`` (and the
    init binary, and the executor bundle) at their place under :func:`reachable_bundle`'s
    alias."""
    alias = REACHABLE_ROOT / sandbox_dir.name

    def moved(path: str) -> str:
        if path == str(init_binary):
            return str(alias / INIT_IN_BUNDLE)
        if executor_bundle is not None and path == str(executor_bundle):
            return str(alias / EXECUTOR_BUNDLE_IN_FOLDER)
        inner = Path(path)
        if inner == sandbox_dir or sandbox_dir in inner.parents:
            return str(alias / inner.relative_to(sandbox_dir))
        return path

    config["root"]["path"] = moved(config["root"]["path"])
    for mount in config["mounts"]:
        if mount.get("type") == "bind":
            mount["source"] = moved(mount["source"])
