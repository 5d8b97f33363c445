"""Remove: a file, a symlink, an empty directory, or (``recursive``) a whole tree.

The path is resolved in-root up to its parent (symlinked parents followed as
the sandbox sees them); the last component is never followed: a symlink is
removed itself, not what it points to. A tree is removed by directory fds
only: each child directory is opened with openat2 ``RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS`` and ``O_NOFOLLOW | O_DIRECTORY`` from its parent's fd,
so a directory swapped for a symlink meanwhile is unlinked as a link, never
entered, and nothing but a directory is ever opened.

Why not ``shutil.rmtree(dir_fd=...)``: its fd walk opens each child with plain
``open(name, O_RDONLY)`` and checks *afterwards* that it was the directory it
lstat-ed; on the host that open may already have followed a planted symlink
to a device node (opening ``/dev/watchdog`` has effects). Ours never opens
anything but a directory beneath the one it holds.

A sandbox that keeps refilling a directory while it is removed makes the
removal fail (FAILED_PRECONDITION) after a few rounds instead of looping.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from orchard.common.errors import precondition

from .confined import ConfinedRoot
from .fserrors import FILE_EXISTS, IS_A_DIRECTORY, UNSPECIFIED, fs_error
from .openat2 import RESOLVE_NO_SYMLINKS, openat2
from .paths import SandboxPath

# Each level is two Python frames on the worker's stack (limit 1000) and one open fd.
MAX_TREE_DEPTH = 256
_ROUNDS = 3
_DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def remove(root: Path, path: SandboxPath, recursive: bool, *, same_mount: bool = True) -> int:
    """Remove ``path``; return how many entries went. Blocking: run it on a worker."""
    if not path.parts:
        raise precondition("/ cannot be removed", IS_A_DIRECTORY)
    with ConfinedRoot.open(root, same_mount=same_mount) as confined:
        parent = confined.open_dir(path.parent)
        try:
            return _remove_entry(parent, path, recursive, confined.resolve_beneath)
        except OSError as err:
            raise fs_error(err, path.display) from err
        finally:
            os.close(parent)


def _remove_entry(parent: int, path: SandboxPath, recursive: bool, resolve: int) -> int:
    st = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path.name, dir_fd=parent)
        return 1
    if not recursive:
        try:
            os.rmdir(path.name, dir_fd=parent)
        except OSError as err:
            if err.errno == errno.ENOTEMPTY:
                raise precondition(
                    f"{path.display} is a directory that is not empty; remove it recursively",
                    IS_A_DIRECTORY,
                ) from err
            raise
        return 1
    return _TreeRemoval(resolve).remove(parent, path, 0)


class _TreeRemoval:
    def __init__(self, resolve: int) -> None:
        self.resolve = resolve | RESOLVE_NO_SYMLINKS
        self.removed = 0

    def remove(self, parent: int, path: SandboxPath, level: int) -> int:
        """Remove the directory ``path.name`` below ``parent`` with all it holds."""
        if level >= MAX_TREE_DEPTH:
            raise precondition(
                f"{path.display} is more than {MAX_TREE_DEPTH} directories deep; remove its "
                "deepest part first",
                UNSPECIFIED,
            )
        for _ in range(_ROUNDS):
            try:
                fd = openat2(parent, path.name, _DIR_READ, 0, self.resolve)
            except OSError as err:
                if err.errno in (errno.ENOTDIR, errno.ELOOP):
                    os.unlink(path.name, dir_fd=parent)  # swapped for a non-directory
                    self.removed += 1
                    return self.removed
                raise
            try:
                self._empty(fd, path, level)
            finally:
                os.close(fd)
            try:
                os.rmdir(path.name, dir_fd=parent)
            except OSError as err:
                if err.errno == errno.ENOTEMPTY:
                    continue  # the sandbox added entries meanwhile: another round
                raise
            self.removed += 1
            return self.removed
        raise precondition(f"{path.display} kept being refilled while it was removed", FILE_EXISTS)

    def _empty(self, dir_fd: int, where: SandboxPath, level: int) -> None:
        for name in os.listdir(dir_fd):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                self.remove(dir_fd, where.child(name), level + 1)
                continue
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            except IsADirectoryError:  # swapped for a directory meanwhile
                self.remove(dir_fd, where.child(name), level + 1)
                continue
            self.removed += 1
