"""The blob store and the unpacked layers a pull shares between images, keyed by digest.

Layout under the images folder (hidden: ``ImageStore.list`` skips dot-folders)::

    .blobs/sha256/<hex>            a verified blob (layer tarball, config)
    .blobs/sha256/<hex>.partial    a blob being downloaded (flock'ed by its writer)
    .layers/sha256-<hex>/          the unpacked layer of blob <hex>, read-only lower dir
    .layers/.tmp-<pid>-*           a layer being unpacked (removed by the next pull once
                                   that process is gone)

A blob is renamed into place only after its size and digest matched, so a
name in ``.blobs`` is a verified blob. An interrupted download leaves its
``.partial``: the next pull re-hashes those bytes and asks the registry for
the rest with ``Range`` (or starts over when the registry ignores it). A layer
folder is likewise renamed into place whole; an image's ``layers/<n>`` is a
relative symlink to it, which overlayfs (and ``open_tree``) follow, so two
images with a layer in common keep it once on disk and in the page cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from .errors import INVALID_MANIFEST, PullError
from .ref import DIGEST_RE

BLOBS_DIR = ".blobs"
LAYERS_DIR = ".layers"
PARTIAL_SUFFIX = ".partial"
TMP_PREFIX = ".tmp-"
HASH_CHUNK = 1 << 20


def _split(digest: str) -> tuple[str, str]:
    match = DIGEST_RE.match(digest)
    if match is None:
        raise PullError(INVALID_MANIFEST, f"bad digest {digest!r}")
    groups = [g for g in match.groups() if g]
    return groups[0], groups[1]


def hash_file(path: Path, algorithm: str, limit: int | None = None) -> tuple[object, int]:
    """(hash object over the first ``limit`` bytes of ``path``, bytes hashed)."""
    digest = hashlib.new(algorithm)
    done = 0
    with open(path, "rb") as f:
        while limit is None or done < limit:
            chunk = f.read(HASH_CHUNK if limit is None else min(HASH_CHUNK, limit - done))
            if not chunk:
                break
            digest.update(chunk)
            done += len(chunk)
    return digest, done


class BlobStore:
    def __init__(self, images_dir: Path) -> None:
        self.images_dir = images_dir
        self.blobs = images_dir / BLOBS_DIR
        self.layers = images_dir / LAYERS_DIR

    def blob_path(self, digest: str) -> Path:
        algorithm, hexdigest = _split(digest)
        return self.blobs / algorithm / hexdigest

    def partial_path(self, digest: str) -> Path:
        path = self.blob_path(digest)
        return path.with_name(path.name + PARTIAL_SUFFIX)

    def layer_dir(self, digest: str) -> Path:
        algorithm, hexdigest = _split(digest)
        return self.layers / f"{algorithm}-{hexdigest}"

    def has_blob(self, digest: str, size: int) -> bool:
        try:
            return self.blob_path(digest).stat().st_size == size
        except FileNotFoundError:
            return False

    def has_layer(self, digest: str) -> bool:
        return self.layer_dir(digest).is_dir()

    def open_partial(self, digest: str) -> int:
        """The ``.partial`` file of ``digest``, opened and exclusively locked (blocks while
        another process downloads it); the caller closes the fd."""
        path = self.partial_path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def promote(self, digest: str) -> Path:
        """Move a verified ``.partial`` into place (its writer holds the lock)."""
        final = self.blob_path(digest)
        os.rename(self.partial_path(digest), final)
        os.chmod(final, 0o644)
        return final

    def new_layer_tmp(self) -> Path:
        self.layers.mkdir(parents=True, exist_ok=True)
        os.chmod(self.layers, 0o755)  # runc in a user namespace walks through it
        path = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=self.layers))
        os.chmod(path, 0o755)
        return path

    def remove_dead_tmp(self) -> None:
        """Drop the half-unpacked layers of pulls whose process is gone (a kill mid-unpack)."""
        if not self.layers.is_dir():
            return
        for entry in self.layers.iterdir():
            if not entry.name.startswith(TMP_PREFIX):
                continue
            pid = entry.name[len(TMP_PREFIX) :].partition("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(entry, ignore_errors=True)

    def missing_bytes(self, blobs: list[tuple[str, int]]) -> int:
        """Bytes still to download for ``(digest, size)`` pairs (partials count as done)."""
        total = 0
        for digest, size in dict(blobs).items():
            if self.has_blob(digest, size) or self.has_layer(digest):
                continue
            try:
                total += max(0, size - self.partial_path(digest).stat().st_size)
            except FileNotFoundError:
                total += size
        return total

    def install_layer(self, tmp: Path, digest: str) -> Path:
        """Rename the unpacked ``tmp`` into place; a copy another pull put there first wins."""
        final = self.layer_dir(digest)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
        return final
