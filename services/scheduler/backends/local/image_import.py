"""Import images into the store: ``docker save`` tarballs, OCI image layouts, rootfs folders.

- ``docker save`` (a tar or its unpacked folder): ``manifest.json`` names the
  config and the layer tars, lowest first.
- OCI image layout (a tar or a folder): ``oci-layout`` + ``index.json`` +
  ``blobs/<alg>/<hex>``; nested indexes are followed (preferring this
  machine's platform), layers may be plain or gzip (zstd is refused), and
  every blob is checked against its sha256 digest.
- A plain rootfs folder: copied as one layer (``cp -a``: owners, modes,
  links, xattrs kept).
- A rootfs tarball (``docker export`` output; plain, gzip, bzip2, xz or zstd):
  unpacked as one layer (:mod:`.rootfs_tar`). A tar file is one only when it
  holds neither ``manifest.json`` nor ``oci-layout`` (read to the end to know,
  so a compressed one is decompressed twice: correctness over speed here).

Every layer is unpacked into its own folder by ``layer_tar`` (whiteouts turned
into overlayfs ones), so layers stay separate lower dirs. The image is built
in a staging folder and renamed into place under the store's lock; a failed
import leaves nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol

from ..base import BackendError
from .images import ImageStore, StoredImage, image_env_defaults, normalize_image_name
from .layer_tar import LayerError, apply_layer
from .rootfs_tar import apply_rootfs_tar, compression_of

DIGEST_RE = re.compile(r"^(sha256|sha512):([0-9a-f]{64,128})$")
INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
MAX_JSON_BYTES = 16 << 20
HASH_CHUNK = 1 << 20


class _Source(Protocol):
    """Files of an image archive, by their path inside it."""

    def open(self, path: str) -> IO[bytes]: ...

    def exists(self, path: str) -> bool: ...


def _inner_path(path: str) -> str:
    parts = [p for p in PurePosixPath(path).parts if p not in ("/", ".")]
    if not parts or ".." in parts:
        raise LayerError(f"bad path in image archive: {path!r}")
    return "/".join(parts)


class _DirSource:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _path(self, path: str) -> Path:
        full = (self.root / _inner_path(path)).resolve()
        if not full.is_relative_to(self.root):
            raise LayerError(f"path {path!r} leaves the image folder")
        return full

    def open(self, path: str) -> IO[bytes]:
        try:
            return open(self._path(path), "rb")
        except FileNotFoundError:
            raise LayerError(f"{path!r} is missing from the image") from None

    def exists(self, path: str) -> bool:
        return self._path(path).is_file()


class _TarSource:
    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.members = {
            _inner_path(m.name): m for m in tar.getmembers() if m.isreg() and m.name.strip("./")
        }

    def open(self, path: str) -> IO[bytes]:
        member = self.members.get(_inner_path(path))
        handle = self.tar.extractfile(member) if member is not None else None
        if handle is None:
            raise LayerError(f"{path!r} is missing from the image archive")
        return handle

    def exists(self, path: str) -> bool:
        return _inner_path(path) in self.members


class _HashingReader:
    """Reads through to ``inner`` while hashing, so a blob is checked as it is unpacked."""

    def __init__(self, inner: IO[bytes], algorithm: str) -> None:
        self.inner = inner
        self.hash = hashlib.new(algorithm)

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.hash.update(data)
        return data

    def drain(self) -> str:
        while self.read(HASH_CHUNK):
            pass
        return self.hash.hexdigest()


def _read_json(source: _Source, path: str) -> Any:
    with source.open(path) as src:
        data = src.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise LayerError(f"{path!r} is too large")
    try:
        return json.loads(data)
    except ValueError as err:
        raise LayerError(f"{path!r} is not JSON: {err}") from err


def _blob_path(digest: str) -> tuple[str, str, str]:
    match = DIGEST_RE.match(str(digest))
    if not match:
        raise LayerError(f"bad blob digest {digest!r}")
    algorithm, hexdigest = match.groups()
    return f"blobs/{algorithm}/{hexdigest}", algorithm, hexdigest


def _read_blob_json(source: _Source, digest: str) -> Any:
    path, algorithm, hexdigest = _blob_path(digest)
    with source.open(path) as src:
        data = src.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise LayerError(f"blob {digest} is too large")
    if hashlib.new(algorithm, data).hexdigest() != hexdigest:
        raise LayerError(f"blob {digest} does not match its digest")
    return json.loads(data)


def _config_env_cwd(config: Any) -> tuple[dict[str, str], str]:
    inner = (config.get("config") or {}) if isinstance(config, dict) else {}
    env: dict[str, str] = {}
    for item in inner.get("Env") or []:
        key, sep, value = str(item).partition("=")
        if sep and key:
            env[key] = value
    cwd = str(inner.get("WorkingDir") or "/")
    return image_env_defaults(env), cwd if cwd.startswith("/") else "/"


class _Importer:
    """Fills a staging folder's ``layers/`` from one source."""

    def __init__(self, staging: Path) -> None:
        self.layers_dir = staging / "layers"
        self.layers: list[str] = []

    def new_layer(self) -> Path:
        name = str(len(self.layers))
        path = self.layers_dir / name
        path.mkdir(mode=0o755)
        self.layers.append(name)
        return path

    def docker_save(self, source: _Source, wanted: str) -> tuple[dict[str, str], str]:
        manifest = _read_json(source, "manifest.json")
        if not isinstance(manifest, list) or not manifest:
            raise LayerError("manifest.json lists no image")
        entry = next((m for m in manifest if wanted in (m.get("RepoTags") or [])), manifest[0])
        config = _read_json(source, str(entry["Config"]))
        for layer_path in entry.get("Layers") or []:
            with source.open(str(layer_path)) as stream:
                apply_layer(stream, self.new_layer())
        return _config_env_cwd(config)

    def oci_layout(self, source: _Source, wanted: str) -> tuple[dict[str, str], str]:
        layout = _read_json(source, "oci-layout")
        if not isinstance(layout, dict) or "imageLayoutVersion" not in layout:
            raise LayerError("oci-layout has no imageLayoutVersion")
        index = _read_json(source, "index.json")
        manifest = _pick_manifest(source, index, wanted)
        config = _read_blob_json(source, manifest["config"]["digest"])
        for layer in manifest.get("layers") or []:
            media_type = str(layer.get("mediaType", ""))
            if "zstd" in media_type:
                raise LayerError(f"zstd layers are not supported ({media_type})")
            path, algorithm, hexdigest = _blob_path(layer["digest"])
            with source.open(path) as raw:
                reader = _HashingReader(raw, algorithm)
                apply_layer(reader, self.new_layer())
                if reader.drain() != hexdigest:
                    raise LayerError(f"layer {layer['digest']} does not match its digest")
        return _config_env_cwd(config)

    def rootfs_tar(self, source: Path) -> tuple[dict[str, str], str]:
        layer = self.new_layer()
        apply_rootfs_tar(source, layer)
        os.chmod(layer, 0o755)
        return image_env_defaults({}), "/"

    def rootfs_dir(self, source: Path) -> tuple[dict[str, str], str]:
        layer = self.new_layer()
        proc = subprocess.run(
            ["cp", "-a", "--reflink=auto", f"{source}/.", str(layer)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise BackendError.failure(f"copying {source} failed: {proc.stderr.strip()[-2000:]}")
        os.chmod(layer, 0o755)
        return image_env_defaults({}), "/"


def _pick_manifest(source: _Source, index: Any, wanted: str, depth: int = 0) -> Any:
    """The image manifest in an OCI index: by ref name, else this machine's platform, else first."""
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not manifests or depth > 4:
        raise LayerError("the OCI index lists no manifest")
    tag = wanted.rpartition(":")[2]
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())

    def score(desc: dict[str, Any]) -> int:
        ref = (desc.get("annotations") or {}).get("org.opencontainers.image.ref.name", "")
        plat = desc.get("platform") or {}
        return (2 if ref in (tag, wanted) else 0) + (1 if plat.get("architecture") == arch else 0)

    chosen = max(manifests, key=score)
    document = _read_blob_json(source, chosen["digest"])
    if chosen.get("mediaType") in INDEX_TYPES or document.get("mediaType") in INDEX_TYPES:
        return _pick_manifest(source, document, wanted, depth + 1)
    return document


@contextmanager
def _open_source(source: Path) -> Iterator[tuple[str, _Source | Path]]:
    """(format, source) for a folder or a tar file: "docker", "oci", "rootfs" (a folder)
    or "rootfs-tar"."""
    if source.is_dir():
        folder = _DirSource(source)
        if folder.exists("manifest.json"):
            yield "docker", folder
        elif folder.exists("oci-layout"):
            yield "oci", folder
        else:
            yield "rootfs", source
        return
    if not source.is_file():
        raise BackendError.invalid(f"image source {source} does not exist", reason="INVALID_IMAGE")
    if compression_of(source) == "zstd":
        yield "rootfs-tar", source  # docker-save and OCI archives are never zstd as a whole
        return
    if not tarfile.is_tarfile(source):
        raise LayerError(
            f"{source} is neither a folder nor a tar archive (plain, gz, bz2, xz, zst)"
        )
    with tarfile.open(source, mode="r:*") as tar:
        archive = _TarSource(tar)
        if archive.exists("manifest.json"):
            yield "docker", archive
            return
        if archive.exists("oci-layout"):
            yield "oci", archive
            return
    yield "rootfs-tar", source  # neither: the tar is a root file system (docker export)


def import_image(
    source: Path, name: str, images_dir: Path, *, replace: bool = False
) -> StoredImage:
    """Import ``source`` (docker-save tar/folder, OCI layout tar/folder, rootfs folder or
    tarball) as ``name``."""
    wanted = normalize_image_name(name)
    store = ImageStore(images_dir)
    with store.lock():
        if store.exists(wanted) and not replace:
            raise BackendError.invalid(f"image {wanted!r} already exists", reason="IMAGE_EXISTS")
        staging = store.new_staging()
        try:
            importer = _Importer(staging)
            with _open_source(source) as (kind, opened):
                if kind == "docker":
                    assert not isinstance(opened, Path)
                    env, cwd = importer.docker_save(opened, wanted)
                elif kind == "oci":
                    assert not isinstance(opened, Path)
                    env, cwd = importer.oci_layout(opened, wanted)
                elif kind == "rootfs-tar":
                    assert isinstance(opened, Path)
                    env, cwd = importer.rootfs_tar(opened)
                else:
                    assert isinstance(opened, Path)
                    env, cwd = importer.rootfs_dir(opened)
            if not importer.layers:
                raise LayerError("the image has no layers")
            return store.commit(staging, wanted, importer.layers, env, cwd, replace=replace)
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            shutil.rmtree(staging, ignore_errors=True)
            raise LayerError(f"malformed image metadata in {source}: {err!r}") from err
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
