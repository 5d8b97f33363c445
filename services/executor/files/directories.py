"""MakeDir (mkdir, or mkdir -p) and Rename inside a sandbox root.

Both resolve the parent(s) in-root (symlinks followed as the sandbox sees
them) and act on the last component with the ``*at`` calls that never follow
it: ``mkdirat`` creates exactly there, ``renameat`` moves the entry itself (a
symlink is renamed, not its target). ``mkdir -p`` reuses the confined
one-component-at-a-time walk of :meth:`ConfinedRoot.open_dir`.

Rename on the overlay root: the kernel refuses (EXDEV) to rename a directory
that comes from the image's read-only layers unless overlayfs has
``redirect_dir``; that is said plainly (copy, then remove), not reported as an
escape. The modes of new directories are set with fchmod on an fd of the
directory just made (the executor's umask would strip bits otherwise).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from orchard.common.errors import ServiceError, invalid, precondition
from orchard.common.file_listing import DEFAULT_DIR_MODE

from .confined import ConfinedRoot
from .fserrors import (
    FILE_EXISTS,
    INVALID_FIELD,
    NOT_A_DIRECTORY,
    PATH_NOT_FOUND,
    UNSPECIFIED,
    fs_error,
)
from .openat2 import RESOLVE_NO_SYMLINKS, openat2
from .owners import HostOwner
from .paths import SandboxPath

_DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def check_dir_mode(mode: int) -> int:
    """Permission bits for a new directory: 0 means 0755; nothing outside 0o7777."""
    if mode == 0:
        return DEFAULT_DIR_MODE
    if mode & ~0o7777:
        raise invalid(f"mode {mode:#o} is not a set of permission bits (0..0o7777)", INVALID_FIELD)
    return mode


def make_dir(
    root: Path,
    path: SandboxPath,
    parents: bool,
    mode: int,
    *,
    owner: int = 0,
    named: HostOwner | None = None,
    same_mount: bool = True,
) -> bool:
    """Create the directory ``path``; False if it already was one. Blocking."""
    uid, gid = (named.uid, named.gid) if named else (owner, owner)
    with ConfinedRoot.open(root, same_mount=same_mount, owner=uid, group=gid) as confined:
        try:
            existing = confined.open_dir(path)
        except ServiceError as err:
            if err.reason == NOT_A_DIRECTORY and _exists(confined, path):
                raise precondition(
                    f"{path.display} exists and is not a directory", FILE_EXISTS
                ) from err
            if err.reason != PATH_NOT_FOUND:
                raise
        else:
            os.close(existing)
            return False
        if parents:
            parent = confined.open_dir(path.parent, create=True)
        else:
            parent = confined.open_dir(path.parent)
        try:
            try:
                os.mkdir(path.name, 0o700, dir_fd=parent)
            except FileExistsError:
                st = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    return False  # made by someone else meanwhile
                raise
            confined.own(path.name, parent)
            fd = openat2(
                parent, path.name, _DIR_READ, 0, confined.resolve_beneath | RESOLVE_NO_SYMLINKS
            )
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            return True
        except OSError as err:
            raise fs_error(err, path.display) from err
        finally:
            os.close(parent)


def _exists(confined: ConfinedRoot, path: SandboxPath) -> bool:
    try:
        fd, _ = confined.stat_path(path, follow=False)
    except ServiceError:
        return False
    os.close(fd)
    return True


def rename(root: Path, source: SandboxPath, dest: SandboxPath, *, same_mount: bool = True) -> None:
    """``mv source dest`` inside the root (replacing a file at ``dest``). Blocking."""
    if not source.parts or not dest.parts:
        raise precondition("/ cannot be renamed, nor replaced", UNSPECIFIED)
    if dest.parts[: len(source.parts)] == source.parts and dest != source:
        raise invalid(f"cannot move {source.display} into itself ({dest.display})", INVALID_FIELD)
    with ConfinedRoot.open(root, same_mount=same_mount) as confined:
        src_parent = confined.open_dir(source.parent)
        try:
            dst_parent = confined.open_dir(dest.parent)
            try:
                os.rename(source.name, dest.name, src_dir_fd=src_parent, dst_dir_fd=dst_parent)
            except OSError as err:
                raise _rename_error(err, source, dest) from err
            finally:
                os.close(dst_parent)
        finally:
            os.close(src_parent)


def _rename_error(err: OSError, source: SandboxPath, dest: SandboxPath) -> Exception:
    code = err.errno
    if code == errno.EXDEV:
        return precondition(
            f"cannot rename {source.display}: the sandbox's file system refuses to move a "
            "directory that comes from the image (overlayfs); copy it and remove the original",
            UNSPECIFIED,
        )
    if code == errno.EINVAL:
        return invalid(f"cannot move {source.display} into itself ({dest.display})", INVALID_FIELD)
    if code in (errno.ENOTEMPTY, errno.EEXIST):
        return precondition(f"{dest.display} is a directory that is not empty", FILE_EXISTS)
    if code == errno.ENOENT:
        return fs_error(err, source.display)
    return fs_error(err, f"{source.display} -> {dest.display}")
