"""A confined view of one sandbox's root directory.

The executor runs as root on the host and works inside ``sandboxes/<id>/rootfs``,
a tree the sandbox's own (possibly hostile) code can rearrange at any moment:
plant symlinks to host paths, fifos that would block a reader forever, device
nodes whose mere ``open`` has side effects on the host (a watchdog, a tape),
or swap a directory for a symlink between two of our calls. So:

* every lookup goes through openat2 with ``RESOLVE_IN_ROOT`` on an fd of the
  rootfs: symlinks resolve as the sandbox sees them (``/etc/x -> /etc/passwd``
  means the sandbox's passwd), ``..`` is clamped at the root, and magic links
  (``/proc/<pid>/root``) are refused; with ``same_mount`` (the default) the
  lookup may not cross into another mount either;
* files are first opened with ``O_PATH`` (no open side effects at all), checked
  with ``fstat``, and only then reopened for I/O through ``/proc/self/fd`` --
  the O_PATH fd pins the inode, so the file checked is the file opened;
* reads use ``O_NONBLOCK | O_NOCTTY``; fds are always ``O_CLOEXEC``;
* directories are created one component at a time with ``mkdirat`` on an fd
  of the confined parent, never by a host path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from types import TracebackType

from orchard.common.errors import infrastructure, precondition

from .fserrors import FILE_EXISTS, IS_A_DIRECTORY, fs_error, unsupported_type
from .openat2 import (
    RESOLVE_BENEATH,
    RESOLVE_IN_ROOT,
    RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_XDEV,
    openat2,
)
from .paths import SandboxPath

O_PATH = os.O_PATH | os.O_CLOEXEC
O_PATH_DIR = O_PATH | os.O_DIRECTORY
O_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
DIR_MODE = 0o755


def reopen(fd: int, flags: int) -> int:
    """Open the inode behind an ``O_PATH`` fd for real I/O.

    Going through the ``/proc/self/fd`` magic link opens exactly the inode the
    O_PATH fd holds, whatever has happened to its name since. This is the host's
    /proc (the executor's own), so it is trusted.
    """
    return os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC | os.O_NOCTTY)


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class ConfinedRoot:
    """One sandbox root, opened as an fd; every path below it is resolved in-root.

    Use it as a context manager (it owns an fd). It is cheap to open -- one
    ``open`` of the host path -- so callers open one per transfer instead of
    caching fds across requests.
    """

    def __init__(
        self, root_fd: int, *, same_mount: bool = True, owner: int = 0, group: int | None = None
    ) -> None:
        self.fd = root_fd
        # Host uid/gid of the sandbox's root (its user namespace's range, or 0): what
        # the executor (host root) creates is chowned to it, so it is root's inside.
        # A call that names an owner (``owners.resolve_owner``) sets both explicitly.
        self.owner = owner
        self.group = owner if group is None else group
        self.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
        # Below a fixed directory fd (upload destinations, download walks).
        self.resolve_beneath = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
        if same_mount:
            self.resolve |= RESOLVE_NO_XDEV
            self.resolve_beneath |= RESOLVE_NO_XDEV

    @classmethod
    def open(
        cls, root: Path, *, same_mount: bool = True, owner: int = 0, group: int | None = None
    ) -> ConfinedRoot:
        """Open the host directory ``root`` (a trusted host path from the node layout)."""
        try:
            fd = os.open(root, O_PATH_DIR)
        except OSError as err:
            raise infrastructure(
                f"the sandbox's root filesystem is not available ({err.strerror})",
                "SANDBOX_NOT_READY",
            ) from err
        return cls(fd, same_mount=same_mount, owner=owner, group=group)

    def own(self, name: str, dir_fd: int) -> None:
        """Give the entry just created at ``name`` (not followed) to its owner."""
        if self.owner or self.group:
            os.chown(name, self.owner, self.group, dir_fd=dir_fd, follow_symlinks=False)

    def own_fd(self, fd: int) -> None:
        if self.owner or self.group:
            os.fchown(fd, self.owner, self.group)

    def close(self) -> None:
        if self.fd >= 0:
            close_quietly(self.fd)
            self.fd = -1

    def __enter__(self) -> ConfinedRoot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- lookups -------------------------------------------------------------

    def openat(self, path: SandboxPath, flags: int, *, follow: bool = True) -> int:
        """openat2 ``path`` in-root with ``flags`` (O_CLOEXEC added); errors mapped.

        ``follow=False`` adds O_NOFOLLOW: a symlink as the last component is
        refused (or, with O_PATH, opened as the link itself).
        """
        if not follow:
            flags |= os.O_NOFOLLOW
        try:
            return openat2(self.fd, path.relative, flags | os.O_CLOEXEC, 0, self.resolve)
        except OSError as err:
            raise fs_error(err, path.display) from err

    def stat_path(self, path: SandboxPath, *, follow: bool = True) -> tuple[int, os.stat_result]:
        """An O_PATH fd on ``path`` and its fstat; nothing is opened for I/O."""
        fd = self.openat(path, O_PATH, follow=follow)
        try:
            return fd, os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise

    def open_regular(self, path: SandboxPath) -> tuple[int, os.stat_result]:
        """Open a regular file for reading; refuse directories, fifos, devices, sockets.

        Symlinks are followed the way the sandbox would follow them (in-root).
        """
        pfd, st = self.stat_path(path)
        try:
            if stat.S_ISDIR(st.st_mode):
                raise precondition(f"{path.display} is a directory", IS_A_DIRECTORY)
            if not stat.S_ISREG(st.st_mode):
                raise unsupported_type(path.display, st.st_mode)
            try:
                return reopen(pfd, O_READ), st
            except OSError as err:
                raise fs_error(err, path.display) from err
        finally:
            os.close(pfd)

    def open_dir(self, path: SandboxPath, *, create: bool = False) -> int:
        """An O_PATH fd on the directory ``path``, creating missing ones if ``create``."""
        try:
            return openat2(self.fd, path.relative, O_PATH_DIR, 0, self.resolve)
        except OSError as err:
            if not (create and err.errno == errno.ENOENT):
                raise fs_error(err, path.display) from err
        return self._make_dirs(path)

    def _make_dirs(self, path: SandboxPath) -> int:
        """``mkdir -p`` inside the root, one component at a time.

        Each prefix is re-resolved from the root fd (so a symlinked component is
        followed in-root, as the sandbox would) and the missing component is made
        with mkdirat on the fd of its resolved parent; mkdirat never follows a
        link, so the new directory lands exactly there.
        """
        parent = os.dup(self.fd)
        try:
            for depth in range(1, len(path.parts) + 1):
                prefix = SandboxPath(path.parts[:depth])
                fd = self._open_or_make(parent, prefix)
                os.close(parent)
                parent = fd
            result, parent = parent, -1
            return result
        finally:
            if parent >= 0:
                os.close(parent)

    def _open_or_make(self, parent_fd: int, prefix: SandboxPath) -> int:
        for _ in range(3):
            try:
                return openat2(self.fd, prefix.relative, O_PATH_DIR, 0, self.resolve)
            except OSError as err:
                if err.errno != errno.ENOENT:
                    raise fs_error(err, prefix.display) from err
            try:
                os.mkdir(prefix.name, DIR_MODE, dir_fd=parent_fd)
                self.own(prefix.name, parent_fd)
            except FileExistsError:
                # Raced with a concurrent mkdir -- or a dangling symlink sits
                # there (mkdirat does not follow it); retry the lookup.
                continue
            except OSError as err:
                raise fs_error(err, prefix.display) from err
        raise precondition(
            f"cannot create directory {prefix.display}: something that is not a directory "
            "(e.g. a dangling symlink) is in the way",
            FILE_EXISTS,
        )
