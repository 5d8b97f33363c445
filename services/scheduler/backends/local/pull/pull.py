"""One pull: reference -> manifest (platform picked from an index) -> verified blobs ->
unpacked shared layers -> an image in the node's store, with progress events.

Every blob's size and digest are checked while it streams, and every layer's
uncompressed bytes against the config's ``rootfs.diff_ids`` while it unpacks. How far a
layer may expand is bounded (:func:`layer_limits`): a small blob can unpack to far more than
the download check saw (a decompression bomb, sparse members, millions of empty files).

Blobs download in parallel (``parallel`` at a time, default 4) and each layer is
unpacked as soon as its blob is verified, while the others still download;
layers are independent folders (whiteouts become overlayfs markers inside each,
:mod:`..layer_tar`), so unpacking needs no order, and the image keeps them in
the manifest's order. A blob whose stream breaks is resumed with ``Range`` up
to three times within the pull, and a pull run again after being killed
resumes from the ``.partial`` files (:mod:`.blobs`). The image is committed
under the store's lock only at the end: a failed pull leaves no image, only
verified blobs and layers for the next attempt.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp

from ...base import BackendError
from ..images import ImageStore, StoredImage, image_env_defaults, normalize_image_name, tree_size
from ..layer_tar import LayerError, LayerLimits, LayerTooLargeError, apply_layer
from ..rootfs_tar import apply_rootfs_tar, open_decompressed
from .auth import find_credentials
from .blobs import LAYERS_DIR, BlobStore, hash_file
from .client import RegistryClient
from .errors import (
    DIGEST_MISMATCH,
    INSUFFICIENT_STORAGE,
    INVALID_MANIFEST,
    INVALID_REFERENCE,
    PLATFORM_NOT_FOUND,
    REGISTRY_UNREACHABLE,
    STORAGE_ERROR,
    PullError,
)
from .manifests import (
    ACCEPT,
    DEFAULT_PLATFORM,
    INDEX_TYPES,
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    Descriptor,
    ImageConfig,
    Manifest,
    media_type_of,
    normalize_platform,
    parse_config,
    parse_manifest,
    pick_platform,
)
from .ref import ImageRef, ReferenceError, local_name, parse_ref

DEFAULT_PARALLEL = 4
ATTEMPTS = 3
PROGRESS_EVERY = 0.5
"""Seconds between two byte-count events of one layer."""


@dataclass
class PullEvent:
    """One step of a pull, for the progress printers (``--json`` prints it as it is)."""

    event: str
    """``resolved``, ``layer``, ``bytes``, ``layer-done``, ``unpacked``, ``done``."""
    ref: str = ""
    layer: int = 0
    """1-based position in the manifest (0 for the image as a whole)."""
    layers: int = 0
    digest: str = ""
    size: int = 0
    done: int = 0
    status: str = ""
    """``layer``: ``download``, ``resume`` or ``cached``; ``layer-done``: ``verified``."""
    name: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


Progress = Callable[[PullEvent], None]


@dataclass
class _Layer:
    index: int
    descriptor: Descriptor
    diff_id: str
    """The config's digest of the layer's uncompressed tar ("" when it has none)."""


class _HashingReader:
    """Reads through while hashing: the uncompressed tar is checked as it is unpacked."""

    def __init__(self, inner: IO[bytes], algorithm: str) -> None:
        self.inner = inner
        self.hash = hashlib.new(algorithm)

    def read(self, size: int = -1, /) -> bytes:
        data = self.inner.read(size)
        self.hash.update(data)
        return data


DEFAULT_MAX_LAYER_BYTES = 32 << 30
DEFAULT_MAX_LAYER_ENTRIES = 1_000_000
DISK_RESERVE_FRACTION = 0.05
"""The share of the images folder's file system a pull leaves free, whatever the settings."""
UNPACKS_AT_ONCE = 2


def _positive_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {raw!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be at least 1, not {value}")
    return value


def layer_limits(images_dir: Path) -> LayerLimits:
    """The bound on one layer's unpacked size, now: ``ORCHARD_IMAGE_MAX_LAYER_BYTES`` (default
    32 GiB of file contents) and ``ORCHARD_IMAGE_MAX_LAYER_ENTRIES`` (default 1,000,000
    members), and never more than the images folder's free space less a 5% reserve of its
    file system, shared by the layers that unpack at once."""
    folder = images_dir
    while not folder.exists():
        folder = folder.parent
    usage = shutil.disk_usage(folder)
    room = max(0, usage.free - int(usage.total * DISK_RESERVE_FRACTION)) // UNPACKS_AT_ONCE
    return LayerLimits(
        max_bytes=min(
            _positive_env("ORCHARD_IMAGE_MAX_LAYER_BYTES", DEFAULT_MAX_LAYER_BYTES), room
        ),
        max_entries=_positive_env("ORCHARD_IMAGE_MAX_LAYER_ENTRIES", DEFAULT_MAX_LAYER_ENTRIES),
    )


def _unpack_checked(
    blob: Path, dest: Path, diff_id: str, what: str, limits: LayerLimits | None = None
) -> None:
    """Unpack ``blob`` into ``dest`` within ``limits``; with a ``diff_id``, the uncompressed
    bytes must match it (what the config promises; the blob's own digest is checked already)."""
    if not diff_id:
        apply_rootfs_tar(blob, dest, limits)
        return
    algorithm, _, hexdigest = diff_id.partition(":")
    with open_decompressed(blob) as stream:
        reader = _HashingReader(stream, algorithm)
        apply_layer(reader, dest, limits)
        while reader.read(1 << 20):  # what tar's end marker left unread
            pass
    if reader.hash.hexdigest() != hexdigest:
        raise PullError(
            DIGEST_MISMATCH,
            f"{what}: the uncompressed layer has digest {algorithm}:{reader.hash.hexdigest()}, "
            f"the image config says {diff_id}",
        )


class _Pull:
    def __init__(
        self, client: RegistryClient, store: BlobStore, progress: Progress, parallel: int
    ) -> None:
        self.client = client
        self.blobs = store
        self.progress = progress
        self.downloads = asyncio.Semaphore(max(1, parallel))
        self.unpacks = asyncio.Semaphore(UNPACKS_AT_ONCE)
        self.ref = str(client.ref)
        self.total_layers = 0
        self.download_seconds = 0.0
        self.unpack_seconds = 0.0
        self.started = time.monotonic()
        self.last_verified = self.started

    def emit(self, event: str, **fields: Any) -> None:
        self.progress(PullEvent(event, ref=self.ref, layers=self.total_layers, **fields))

    # -- manifests --------------------------------------------------------------

    async def _document(self, reference: str, expect: Descriptor | None) -> tuple[bytes, str, str]:
        """(bytes, media type, digest) of the manifest or index at ``reference``."""
        async with self.client.get(f"manifests/{reference}", {"Accept": ACCEPT}) as resp:
            data = await resp.content.read(MAX_MANIFEST_BYTES + 1)
            header_type = resp.headers.get("Content-Type", "")
        if len(data) > MAX_MANIFEST_BYTES:
            raise PullError(
                INVALID_MANIFEST, f"{self.ref}: manifest over {MAX_MANIFEST_BYTES} bytes"
            )
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        pinned = expect.digest if expect else (reference if ":" in reference else "")
        if pinned:
            algorithm, _, hexdigest = pinned.partition(":")
            if hashlib.new(algorithm, data).hexdigest() != hexdigest:
                raise PullError(
                    DIGEST_MISMATCH, f"{self.ref}: manifest {pinned} does not match its digest"
                )
            digest = pinned
        if expect is not None and len(data) != expect.size:
            raise PullError(
                DIGEST_MISMATCH,
                f"{self.ref}: manifest {expect.digest} is {len(data)} bytes, "
                f"the index says {expect.size}",
            )
        return data, media_type_of(data, header_type, f"{self.ref} manifest"), digest

    async def resolve(self, platform: str) -> tuple[Manifest, str, str]:
        """(manifest, its digest, index digest or "") for ``platform``."""
        data, media_type, digest = await self._document(self.client.ref.reference, None)
        index_digest = ""
        if media_type in INDEX_TYPES:
            index_digest = digest
            entry = pick_platform(data, platform, f"{self.ref} index")
            data, media_type, digest = await self._document(entry.digest, entry)
            if media_type in INDEX_TYPES:
                raise PullError(INVALID_MANIFEST, f"{self.ref}: an index inside the index")
        return parse_manifest(data, media_type, f"{self.ref} manifest"), digest, index_digest

    # -- blobs ------------------------------------------------------------------

    async def fetch(self, desc: Descriptor, label: str, layer: int = 0) -> Path:
        """The verified blob of ``desc`` in the store, downloaded (or resumed) if needed."""
        if self.blobs.has_blob(desc.digest, desc.size):
            return self.blobs.blob_path(desc.digest)
        async with self.downloads:
            fd = await asyncio.to_thread(self.blobs.open_partial, desc.digest)
            try:
                started = time.monotonic()
                for attempt in range(ATTEMPTS):
                    if self.blobs.has_blob(desc.digest, desc.size):  # another process's pull
                        return self.blobs.blob_path(desc.digest)
                    try:
                        await self._download(fd, desc, label, layer, attempt)
                        break
                    except PullError as err:
                        if err.reason != REGISTRY_UNREACHABLE or attempt == ATTEMPTS - 1:
                            raise
                await asyncio.to_thread(os.fdatasync, fd)
                self.download_seconds += time.monotonic() - started
                self.last_verified = time.monotonic()
                return self.blobs.promote(desc.digest)
            finally:
                os.close(fd)

    async def _download(
        self, fd: int, desc: Descriptor, label: str, layer: int, attempt: int
    ) -> None:
        algorithm, _, hexdigest = desc.digest.partition(":")
        offset = os.fstat(fd).st_size
        if offset > desc.size:
            os.ftruncate(fd, 0)
            offset = 0
        hasher: Any = hashlib.new(algorithm)
        if offset:
            hasher, offset = await asyncio.to_thread(
                hash_file, self.blobs.partial_path(desc.digest), algorithm, offset
            )
        if layer:
            status = "resume" if offset else "download"
            self.emit("layer", layer=layer, digest=desc.digest, size=desc.size, done=offset,
                      status=status, extra={"attempt": attempt + 1})  # fmt: skip
        headers = {"Range": f"bytes={offset}-"} if 0 < offset < desc.size else {}
        done = offset
        if offset < desc.size:
            async with self.client.get(f"blobs/{desc.digest}", headers) as resp:
                if offset and not (
                    resp.status == 206
                    and resp.headers.get("Content-Range", "").startswith(f"bytes {offset}-")
                ):
                    offset = done = 0  # the registry ignored the range: start over
                    hasher = hashlib.new(algorithm)
                    os.ftruncate(fd, 0)
                os.lseek(fd, offset, os.SEEK_SET)
                last = time.monotonic()
                try:
                    async for chunk in resp.content.iter_any():
                        done += len(chunk)
                        if done > desc.size:
                            os.ftruncate(fd, 0)
                            raise PullError(
                                DIGEST_MISMATCH,
                                f"{label} {desc.digest}: the registry sent more than the "
                                f"manifest's {desc.size} bytes",
                            )
                        hasher.update(chunk)
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view) :]
                        if layer and time.monotonic() - last >= PROGRESS_EVERY:
                            last = time.monotonic()
                            self.emit("bytes", layer=layer, digest=desc.digest, size=desc.size,
                                      done=done)  # fmt: skip
                except (TimeoutError, aiohttp.ClientError, OSError) as err:
                    # Disk errors are not the network's (TimeoutError is an OSError too).
                    if isinstance(err, OSError) and not isinstance(
                        err, (ConnectionError, TimeoutError)
                    ):
                        raise
                    raise PullError(
                        REGISTRY_UNREACHABLE,
                        f"{label} {desc.digest}: download interrupted after {done} of "
                        f"{desc.size} bytes ({type(err).__name__}); pull again to resume",
                    ) from None
        if done < desc.size:
            raise PullError(
                REGISTRY_UNREACHABLE,
                f"{label} {desc.digest}: the registry sent {done} of {desc.size} bytes; "
                "pull again to resume",
            )
        if hasher.hexdigest() != hexdigest:
            os.ftruncate(fd, 0)
            raise PullError(
                DIGEST_MISMATCH,
                f"{label} {desc.digest}: the downloaded bytes have digest "
                f"{algorithm}:{hasher.hexdigest()} (discarded; the registry's copy is corrupt "
                "or the manifest is wrong)",
            )

    # -- layers -----------------------------------------------------------------

    async def layer(self, item: _Layer) -> Path:
        desc, label = item.descriptor, f"layer {item.index}/{self.total_layers}"
        if self.blobs.has_layer(desc.digest):
            self.emit("layer", layer=item.index, digest=desc.digest, size=desc.size,
                      done=desc.size, status="cached")  # fmt: skip
            return self.blobs.layer_dir(desc.digest)
        if self.blobs.has_blob(desc.digest, desc.size):
            self.emit("layer", layer=item.index, digest=desc.digest, size=desc.size,
                      done=desc.size, status="downloaded")  # fmt: skip
        blob = await self.fetch(desc, label, item.index)
        self.emit("layer-done", layer=item.index, digest=desc.digest, size=desc.size,
                  done=desc.size, status="verified")  # fmt: skip
        async with self.unpacks:
            started = time.monotonic()
            path = await asyncio.to_thread(self._unpack, blob, desc.digest, label, item.diff_id)
            self.unpack_seconds += time.monotonic() - started
        self.emit("unpacked", layer=item.index, digest=desc.digest, size=desc.size,
                  seconds=round(time.monotonic() - started, 3))  # fmt: skip
        return path

    def _unpack(self, blob: Path, digest: str, label: str, diff_id: str) -> Path:
        tmp = self.blobs.new_layer_tmp()
        limits = layer_limits(self.blobs.images_dir)
        try:
            _unpack_checked(blob, tmp, diff_id, f"{self.ref} {label} {digest}", limits)
        except (LayerError, LayerTooLargeError) as err:
            shutil.rmtree(tmp, ignore_errors=True)
            raise type(err)(f"{self.ref} {label} {digest}: {err.message}") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        os.chmod(tmp, 0o755)
        return self.blobs.install_layer(tmp, digest)


def _topmost(layer_dirs: list[Path]) -> list[Path]:
    """Each layer once, at its topmost position. overlayfs refuses a lower dir given twice,
    and old manifests repeat layers (the empty one above all); dropping the lower copies
    changes nothing in the merged view, since the top copy brings every file and whiteout
    of the layer again over everything below it."""
    last = {path: i for i, path in enumerate(layer_dirs)}
    return [path for i, path in enumerate(layer_dirs) if last[path] == i]


def _check_space(store: BlobStore, manifest: Manifest, images_dir: Path) -> None:
    """Refuse a pull whose blobs alone do not fit (unpacked layers need more on top)."""
    pairs = [(d.digest, d.size) for d in (manifest.config, *manifest.layers)]
    needed = store.missing_bytes(pairs)
    folder = images_dir
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise PullError(
            INSUFFICIENT_STORAGE,
            f"the image's blobs need {needed} bytes to download and {folder} has {free} free",
        )


def _check_platform(config: ImageConfig, platform: str, ref: str) -> None:
    os_arch = config.platform.strip("/")
    if "/" not in os_arch or os_arch.startswith("/") or os_arch.endswith("/"):
        return  # the config does not say: nothing to check
    wanted = "/".join(normalize_platform(platform).split("/")[:2])
    if os_arch.lower() != wanted:
        raise PullError(
            PLATFORM_NOT_FOUND,
            f"{ref} is a single {os_arch} image, not {wanted} (pull with --platform {os_arch} "
            "if that is what you want)",
        )


def _commit(
    images_dir: Path,
    name: str,
    layer_dirs: list[Path],
    config: ImageConfig,
    origin: dict[str, Any],
) -> StoredImage:
    store = ImageStore(images_dir)
    sizes: dict[Path, int] = {}
    for path in layer_dirs:
        if path not in sizes:
            sizes[path] = tree_size(path)
    with store.lock():
        staging = store.new_staging()
        try:
            names = []
            for i, path in enumerate(layer_dirs):
                os.symlink(f"../../{LAYERS_DIR}/{path.name}", staging / "layers" / str(i))
                names.append(str(i))
            return store.commit(
                staging,
                name,
                names,
                image_env_defaults(config.env),
                config.working_dir,
                replace=store.exists(name),
                size_bytes=sum(sizes.values()),
                origin=origin,
            )
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


async def pull_image(
    images_dir: Path,
    reference: str,
    *,
    name: str | None = None,
    platform: str = DEFAULT_PLATFORM,
    auth_file: Path | None = None,
    plain_http: bool = False,
    ca_file: Path | None = None,
    parallel: int = DEFAULT_PARALLEL,
    progress: Progress | None = None,
) -> StoredImage:
    """Pull ``reference`` into the store at ``images_dir`` as ``name`` (default: the
    reference's last path component and tag, :func:`.ref.local_name`)."""
    try:
        ref: ImageRef = parse_ref(reference)
        stored_name = normalize_image_name(name or local_name(ref))
    except ReferenceError as err:
        raise PullError(INVALID_REFERENCE, str(err)) from None
    except BackendError as err:
        raise PullError(INVALID_REFERENCE, err.message) from None
    normalize_platform(platform)
    try:
        return await _pull(images_dir, ref, stored_name, platform, auth_file, plain_http,
                           ca_file, parallel, progress)  # fmt: skip
    except OSError as err:  # the node's disk, not the registry (those are PullErrors)
        raise PullError(
            INSUFFICIENT_STORAGE if err.errno == errno.ENOSPC else STORAGE_ERROR,
            f"{ref}: writing the images folder {images_dir} failed: {err}",
        ) from None


async def _pull(
    images_dir: Path,
    ref: ImageRef,
    stored_name: str,
    platform: str,
    auth_file: Path | None,
    plain_http: bool,
    ca_file: Path | None,
    parallel: int,
    progress: Progress | None,
) -> StoredImage:
    started = time.monotonic()
    emit = progress or (lambda _event: None)
    credentials = find_credentials(ref.registry, auth_file)
    async with RegistryClient.new_session(ca_file, connections=parallel + 2) as session:
        client = RegistryClient(ref, session, credentials=credentials, plain_http=plain_http)
        job = _Pull(client, BlobStore(images_dir), emit, parallel)
        await asyncio.to_thread(job.blobs.remove_dead_tmp)
        manifest, manifest_digest, index_digest = await job.resolve(platform)
        job.total_layers = len(manifest.layers)
        if manifest.config.size > MAX_CONFIG_BYTES:
            raise PullError(INVALID_MANIFEST, f"{ref}: image config over {MAX_CONFIG_BYTES} bytes")
        _check_space(job.blobs, manifest, images_dir)
        config_blob = await job.fetch(manifest.config, "config")
        config = parse_config(config_blob.read_bytes(), f"{ref} config")
        _check_platform(config, platform, str(ref))
        job.emit("resolved", digest=manifest_digest, name=stored_name,
                 size=sum(d.size for d in manifest.layers),
                 extra={"index": index_digest, "platform": config.platform})  # fmt: skip
        if not manifest.layers:
            raise PullError(INVALID_MANIFEST, f"{ref}: the manifest lists no layers")
        if config.diff_ids and len(config.diff_ids) != len(manifest.layers):
            raise PullError(
                INVALID_MANIFEST,
                f"{ref}: the manifest has {len(manifest.layers)} layers, the config "
                f"{len(config.diff_ids)} diff_ids",
            )
        diff_ids = config.diff_ids or [""] * len(manifest.layers)
        unique: dict[str, asyncio.Task[Path]] = {}
        for i, (desc, diff_id) in enumerate(zip(manifest.layers, diff_ids, strict=True), start=1):
            if desc.digest not in unique:
                unique[desc.digest] = asyncio.create_task(job.layer(_Layer(i, desc, diff_id)))
        # A failed layer does not cancel the others: what they verify is kept for the
        # next attempt. The first failure in manifest order is the one reported.
        try:
            outcomes = await asyncio.gather(*unique.values(), return_exceptions=True)
        except asyncio.CancelledError:
            for task in unique.values():
                task.cancel()
            raise
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        layer_dirs = _topmost([unique[d.digest].result() for d in manifest.layers])
    origin = {
        "source": str(ref),
        "manifest_digest": manifest_digest,
        "index_digest": index_digest,
        "config_digest": manifest.config.digest,
        "platform": config.platform,
        "user": config.user,
        "cmd": config.cmd,
        "entrypoint": config.entrypoint,
        "layer_digests": [d.digest for d in manifest.layers],
    }
    image = await asyncio.to_thread(_commit, images_dir, stored_name, layer_dirs, config, origin)
    job.emit("done", name=image.name, digest=manifest_digest, size=image.size_bytes,
             seconds=round(time.monotonic() - started, 3),
             extra={"download_seconds": round(job.download_seconds, 3),
                    "download_wall_seconds": round(job.last_verified - job.started, 3),
                    "unpack_seconds": round(job.unpack_seconds, 3)})  # fmt: skip
    return image
