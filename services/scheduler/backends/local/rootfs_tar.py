"""A rootfs tarball (``docker export``, ``tar -C rootfs -c .``), plain or compressed.

Such a tarball is one image layer: it is unpacked by :func:`layer_tar.apply_layer`,
which already treats every member as hostile (absolute names and ``..``
refused, folders on the way opened with ``O_NOFOLLOW``, hard links only to
files inside the layer, device nodes skipped). This module only turns the
file into a stream of tar bytes:

* plain, gzip, bzip2 and xz are read by ``tarfile``'s own stream mode;
* zstd (``docker export | zstd``, what distributions now publish) is
  decompressed by Debian's ``zstd`` binary in a pipe, because Python 3.11's
  standard library has no zstd and the binary is the reference
  implementation (no new Python dependency for one import path); without it
  the import is refused with a message saying so.

The format is told by the file's magic bytes, not its name.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, cast

from .layer_tar import LayerError, LayerLimits, LayerStats, apply_layer

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_MAGICS = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (ZSTD_MAGIC, "zstd"),
)


def compression_of(path: Path) -> str:
    """ "gzip", "bzip2", "xz", "zstd" or "none", from the first bytes of ``path``."""
    with open(path, "rb") as f:
        head = f.read(8)
    return next((name for magic, name in _MAGICS if head.startswith(magic)), "none")


@contextmanager
def _zstd_stream(path: Path) -> Iterator[IO[bytes]]:
    binary = shutil.which("zstd")
    if binary is None:
        raise LayerError(
            f"{path} is zstd-compressed and the zstd program is not installed "
            "(apt-get install zstd), or decompress it first"
        )
    proc = subprocess.Popen(
        [binary, "-dc", "--no-progress", "--", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        yield proc.stdout
        proc.stdout.read()  # the rest (after tar's end marker) so zstd can finish
    finally:
        proc.stdout.close()
        stderr = proc.stderr.read().decode(errors="replace").strip()
        proc.stderr.close()
        code = proc.wait()
    if code != 0:
        raise LayerError(f"zstd could not decompress {path}: {stderr[-500:] or f'exit {code}'}")


def _decompressing(kind: str, path: Path) -> IO[bytes]:
    if kind == "gzip":
        return cast(IO[bytes], gzip.open(path, "rb"))
    if kind == "bzip2":
        return bz2.open(path, "rb")
    if kind == "xz":
        return lzma.open(path, "rb")
    return open(path, "rb")


@contextmanager
def open_decompressed(path: Path) -> Iterator[IO[bytes]]:
    """The tar bytes of ``path`` (plain, gzip, bzip2, xz or zstd), decompressed."""
    kind = compression_of(path)
    if kind == "zstd":
        with _zstd_stream(path) as stream:
            yield stream
        return
    with _decompressing(kind, path) as stream:
        yield stream


def apply_rootfs_tar(path: Path, dest: Path, limits: LayerLimits | None = None) -> LayerStats:
    """Unpack the rootfs tarball at ``path`` (any supported compression) into ``dest``."""
    if compression_of(path) == "zstd":
        with _zstd_stream(path) as stream:
            return apply_layer(stream, dest, limits)
    with open(path, "rb") as stream:
        return apply_layer(stream, dest, limits)
