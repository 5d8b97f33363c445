"""The async API the executor's gRPC servicer calls, one object per sandbox root.

Every method raises :class:`orchard.common.errors.ServiceError` for refusals
(PATH_ESCAPE, PATH_NOT_FOUND, NOT_A_DIRECTORY, IS_A_DIRECTORY,
UNSUPPORTED_FILE_TYPE, FILE_EXISTS, INVALID_FIELD, RESOURCE_EXHAUSTED...), so
the servicer only has to turn it into a status. The streaming methods raise
before their first item when the request itself is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from orchard._proto.orchard.v1 import executor_pb2

from . import directories, listing, removal, tarstream, transfer
from .bridge import transfer_workers
from .owners import HostOwner, resolve_owner
from .paths import parse_sandbox_path
from .users import lookup_user

T = TypeVar("T")


class SandboxFiles:
    """File operations inside one sandbox's root filesystem (``<home>/sandboxes/<id>/rootfs``).

    Holds no fds: each call opens the root, does its work on a pool worker and
    closes everything, so an instance is free to create per request.
    ``same_mount=False`` lets lookups cross mount points below the root (off
    by default: on the host, the rootfs is one overlay mount, and anything
    mounted below it is not the sandbox's to hand out).
    """

    def __init__(self, root: Path, *, same_mount: bool = True, owner: int = 0) -> None:
        self.root = Path(root)
        self.same_mount = same_mount
        self.owner = owner  # host uid of the sandbox's root (SandboxMeta.root_uid)

    async def read_file(self, path: str) -> AsyncIterator[executor_pb2.FileChunk]:
        """The file's chunks (~1 MiB); the first carries FileInfo (size, permission bits)."""
        async for chunk in transfer.read_file(self.root, path, same_mount=self.same_mount):
            yield chunk

    async def write_file(
        self,
        path: str,
        mode: int,
        make_parents: bool,
        data: AsyncIterator[bytes],
        owner: str = "",
    ) -> int:
        """Write ``data`` atomically to ``path`` (mode 0 = 0644); return the size.

        ``owner``: a user named as in exec ("agent", "1000:1000"); "" = default.
        """
        named = await self._owner(owner)
        return await transfer.write_file(
            self.root,
            path,
            mode,
            make_parents,
            data,
            same_mount=self.same_mount,
            owner=self.owner,
            named=named,
        )

    async def upload(
        self, dest: str, data: AsyncIterator[bytes], owner: str = ""
    ) -> tuple[int, int]:
        """Unpack a tar stream (plain, gzip, bzip2 or xz) into ``dest``; (files, bytes)."""
        named = await self._owner(owner)
        uid, gid = (named.uid, named.gid) if named else (self.owner, None)
        return await tarstream.upload(
            self.root, dest, data, same_mount=self.same_mount, owner=uid, group=gid
        )

    async def stat(self, path: str, follow: bool = True) -> executor_pb2.FileStat:
        """One entry's metadata (in-root; ``follow=False`` = lstat of the last component)."""
        target = parse_sandbox_path(path)
        return await self._blocking(
            partial(
                listing.stat_entry,
                self.root,
                target,
                follow=follow,
                same_mount=self.same_mount,
                base=self.owner,
            )
        )

    async def list_dir(
        self, path: str, depth: int, max_entries: int
    ) -> tuple[list[executor_pb2.FileStat], bool]:
        """The entries below ``path``, ``depth`` levels down, at most ``max_entries``."""
        target = parse_sandbox_path(path)
        levels, limit = listing.check_listing(depth, max_entries)
        return await self._blocking(
            partial(
                listing.list_dir,
                self.root,
                target,
                levels,
                limit,
                same_mount=self.same_mount,
                base=self.owner,
            )
        )

    async def remove(self, path: str, recursive: bool) -> int:
        """Remove a file, symlink or empty directory (a tree with ``recursive``)."""
        target = parse_sandbox_path(path)
        return await self._blocking(
            partial(removal.remove, self.root, target, recursive, same_mount=self.same_mount)
        )

    async def rename(self, source: str, destination: str) -> None:
        """``mv source destination`` inside the sandbox."""
        src = parse_sandbox_path(source, "source")
        dst = parse_sandbox_path(destination, "destination")
        await self._blocking(
            partial(directories.rename, self.root, src, dst, same_mount=self.same_mount)
        )

    async def make_dir(self, path: str, parents: bool, mode: int, owner: str = "") -> bool:
        """mkdir (``parents``: mkdir -p); False if the directory already existed."""
        target = parse_sandbox_path(path)
        dir_mode = directories.check_dir_mode(mode)
        named = await self._owner(owner)
        return await self._blocking(
            partial(
                directories.make_dir,
                self.root,
                target,
                parents,
                dir_mode,
                owner=self.owner,
                named=named,
                same_mount=self.same_mount,
            )
        )

    async def _owner(self, spec: str) -> HostOwner | None:
        if not spec.strip():
            return None
        return await self._blocking(partial(resolve_owner, self.root, spec, self.owner))

    async def _blocking(self, fn: Callable[[], T]) -> T:
        """Run a short blocking file call on the node's fair-share transfer workers."""
        return await (await transfer_workers().run(fn))

    async def download(self, path: str) -> AsyncIterator[bytes]:
        """A tar stream of the file or tree at ``path``, in ~1 MiB chunks."""
        async for chunk in tarstream.download(self.root, path, same_mount=self.same_mount):
            yield chunk

    async def lookup_user(self, user: str) -> tuple[int, int, str]:
        """:func:`lookup_user` off the event loop."""
        return await (await transfer_workers().run(partial(lookup_user, self.root, user)))
