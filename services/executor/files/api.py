"""The async API the executor's gRPC servicer calls, one object per sandbox root.

Every method raises :class:`orchard.common.errors.ServiceError` for refusals
(PATH_ESCAPE, PATH_NOT_FOUND, NOT_A_DIRECTORY, IS_A_DIRECTORY,
UNSUPPORTED_FILE_TYPE, FILE_EXISTS, INVALID_FIELD, RESOURCE_EXHAUSTED...), so
the servicer only has to turn it into a status. The streaming methods raise
before their first item when the request itself is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

from orchard._proto.orchard.v1 import executor_pb2

from . import tarstream, transfer
from .bridge import transfer_workers
from .users import lookup_user


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
        self, path: str, mode: int, make_parents: bool, data: AsyncIterator[bytes]
    ) -> int:
        """Write ``data`` atomically to ``path`` (mode 0 = 0644); return the size."""
        return await transfer.write_file(
            self.root, path, mode, make_parents, data, same_mount=self.same_mount, owner=self.owner
        )

    async def upload(self, dest: str, data: AsyncIterator[bytes]) -> tuple[int, int]:
        """Unpack a tar stream (plain, gzip, bzip2 or xz) into ``dest``; (files, bytes)."""
        return await tarstream.upload(
            self.root, dest, data, same_mount=self.same_mount, owner=self.owner
        )

    async def download(self, path: str) -> AsyncIterator[bytes]:
        """A tar stream of the file or tree at ``path``, in ~1 MiB chunks."""
        async for chunk in tarstream.download(self.root, path, same_mount=self.same_mount):
            yield chunk

    async def lookup_user(self, user: str) -> tuple[int, int, str]:
        """:func:`lookup_user` off the event loop."""
        return await (await transfer_workers().run(partial(lookup_user, self.root, user)))
