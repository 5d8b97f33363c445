"""The node's image store: read-only layer folders plus one ``image.json`` per image.

Layout (see ``orchard.common.layout``)::

    <images_dir>/<folder>/layers/<n>/   one folder per layer, n = 0 is the lowest
    <images_dir>/<folder>/image.json    name, layer order, env, cwd, size

``<folder>`` is the image name with ``:`` turned into ``+`` (a character image
names cannot contain), after the name has been checked against
``layout.IMAGE_NAME_RE``, so no name can point outside the store. Images are
written into a hidden staging folder and renamed into place, so a half-written
image is never visible. Sandboxes mount the layers read-only as overlayfs lower
dirs: creating a sandbox copies no image data.

Run ``python -m orchard.scheduler.backends.local.images build-default`` to build
the default image (``debian:bookworm`` from Debian's packages with mmdebstrap),
``... images import SOURCE NAME`` to import one (see ``image_import``), and
``... images list``. The CLI can call :func:`build_default_image` and
``image_import.import_image`` directly.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.common.layout import IMAGE_NAME_RE

from ..base import BackendError, ImageInfo
from .settings import DEFAULT_IMAGE

IMAGE_META = "image.json"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_PACKAGES = (
    "bash",
    "coreutils",
    "git",
    "python3",
    "python3-pytest",
    "ca-certificates",
    "procps",
    # The SWE test runner's last patch-apply step (`patch --fuzz`) needs it.
    "patch",
)
RECIPE_FILE = "recipe.txt"
STAGING_PREFIX = ".staging-"


def normalize_image_name(name: str) -> str:
    """``name`` with a tag (``latest`` when it has none); refuses malformed names."""
    if IMAGE_NAME_RE.fullmatch(name) is None:  # match() + $ would allow a trailing newline
        raise BackendError.invalid(f"invalid image name {name!r}", reason="INVALID_IMAGE")
    return name if ":" in name else f"{name}:latest"


def image_folder_name(name: str) -> str:
    """The store folder of an image: safe by construction (no ``/``, never ``.`` or ``..``)."""
    folder = normalize_image_name(name).replace(":", "+")
    if "/" in folder or folder in (".", "..") or folder.startswith("."):
        raise BackendError.invalid(f"invalid image name {name!r}", reason="INVALID_IMAGE")
    return folder


def image_env_defaults(env: dict[str, str]) -> dict[str, str]:
    """An image's env with a sensible PATH and HOME when the image sets none."""
    merged = {"PATH": DEFAULT_PATH, "HOME": "/root"}
    merged.update(env)
    return merged


@dataclass(frozen=True)
class StoredImage:
    """One image of the store, as described by its ``image.json``."""

    name: str
    folder: Path
    layers: list[str]
    """Layer folder names under ``layers/``, lowest first."""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = "/"
    size_bytes: int = 0
    origin: dict[str, Any] = field(default_factory=dict)
    """Where a pulled image came from and what its config says beyond env and cwd
    (``source``, ``manifest_digest``, ``platform``, ``user``, ``cmd``, ``entrypoint``);
    empty for built and imported images. Sandboxes do not use it yet."""

    @property
    def layer_paths(self) -> list[Path]:
        """Absolute layer folders, lowest first."""
        return [self.folder / "layers" / layer for layer in self.layers]

    def info(self, default_image: str) -> ImageInfo:
        return ImageInfo(
            name=self.name,
            size_bytes=self.size_bytes,
            layers=len(self.layers),
            is_default=self.name == normalize_image_name(default_image),
        )

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "name": self.name,
            "layers": self.layers,
            "env": self.env,
            "cwd": self.cwd,
            "size_bytes": self.size_bytes,
        }
        if self.origin:
            data["origin"] = self.origin
        return json.dumps(data, indent=2, sort_keys=True)

    @classmethod
    def read(cls, folder: Path) -> StoredImage:
        data = json.loads((folder / IMAGE_META).read_text())
        layers = [str(layer) for layer in data["layers"]]
        for layer in layers:
            if "/" in layer or layer in ("", ".", ".."):
                raise BackendError.failure(f"image {folder.name}: bad layer name {layer!r}")
        return cls(
            name=str(data["name"]),
            folder=folder,
            layers=layers,
            env={str(k): str(v) for k, v in dict(data.get("env", {})).items()},
            cwd=str(data.get("cwd") or "/"),
            size_bytes=int(data.get("size_bytes", 0)),
            origin=dict(data.get("origin") or {}),
        )


def tree_size(path: Path) -> int:
    """Bytes of regular files under ``path``, each hard-linked inode counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += st.st_size
    return total


class ImageStore:
    """Reads and writes images under one folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def folder_of(self, name: str) -> Path:
        return self.root / image_folder_name(name)

    def exists(self, name: str) -> bool:
        return (self.folder_of(name) / IMAGE_META).is_file()

    def get(self, name: str) -> StoredImage:
        folder = self.folder_of(name)
        try:
            return StoredImage.read(folder)
        except FileNotFoundError:
            raise BackendError(
                "IMAGE_NOT_FOUND", f"image {name!r} is not in the store", client_fault=True
            ) from None
        except (ValueError, KeyError, TypeError) as err:
            raise BackendError.failure(f"image {name!r} has a broken image.json: {err}") from err

    def list(self) -> builtins.list[StoredImage]:
        if not self.root.is_dir():
            return []
        images: builtins.list[StoredImage] = []
        for folder in sorted(self.root.iterdir()):
            if folder.name.startswith(".") or not (folder / IMAGE_META).is_file():
                continue
            with contextlib.suppress(ValueError, KeyError, TypeError, OSError, BackendError):
                images.append(StoredImage.read(folder))
        return images

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """An exclusive lock over writers of this store (builds, imports, removals)."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def new_staging(self) -> Path:
        """A fresh hidden folder in the store to build an image in (same filesystem)."""
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.root))
        (staging / "layers").mkdir()
        os.chmod(staging, 0o755)
        return staging

    def commit(
        self,
        staging: Path,
        name: str,
        layers: builtins.list[str],
        env: dict[str, str],
        cwd: str,
        *,
        replace: bool = False,
        size_bytes: int | None = None,
        origin: dict[str, Any] | None = None,
    ) -> StoredImage:
        """Write ``image.json`` into ``staging`` and move it into place as ``name``.

        The caller holds :meth:`lock`. ``size_bytes`` is measured from ``layers/``
        unless given (a pulled image's layers are links to shared folders).
        """
        normalized = normalize_image_name(name)
        target = self.folder_of(normalized)
        image = StoredImage(
            name=normalized,
            folder=target,
            layers=layers,
            env=env,
            cwd=cwd or "/",
            size_bytes=tree_size(staging / "layers") if size_bytes is None else size_bytes,
            origin=origin or {},
        )
        (staging / IMAGE_META).write_text(image.to_json())
        if target.exists():
            if not replace:
                raise BackendError.invalid(
                    f"image {normalized!r} already exists", reason="IMAGE_EXISTS"
                )
            # Running sandboxes keep their lower dirs open; move the old image
            # aside rather than pulling files from under them.
            os.rename(target, self.root / f"{STAGING_PREFIX}old-{target.name}-{time.time_ns()}")
        os.rename(staging, target)
        return image

    def remove_stale_staging(self) -> None:
        """Drop staging folders of builds that died half-way (caller holds :meth:`lock`)."""
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            if entry.name.startswith(STAGING_PREFIX):
                shutil.rmtree(entry, ignore_errors=True)


def build_default_image(
    images_dir: Path,
    *,
    name: str = DEFAULT_IMAGE,
    suite: str = "bookworm",
    mirror: str = DEFAULT_MIRROR,
    packages: tuple[str, ...] = DEFAULT_PACKAGES,
    mmdebstrap: str = "mmdebstrap",
) -> StoredImage:
    """Build the default Debian image with mmdebstrap once; later calls return it at once."""
    store = ImageStore(images_dir)
    # The cache is keyed by what went into the build: changing the package list
    # (or suite, mirror) rebuilds the image instead of serving a stale one.
    recipe = f"mmdebstrap minbase suite={suite} mirror={mirror} include={','.join(packages)}\n"
    if _built_from(store, name) == recipe:
        return store.get(name)
    with store.lock():
        if _built_from(store, name) == recipe:  # built by another process while we waited
            return store.get(name)
        store.remove_stale_staging()
        staging = store.new_staging()
        try:
            layer = staging / "layers" / "0"
            cmd = [
                mmdebstrap,
                "--variant=minbase",
                f"--include={','.join(packages)}",
                "--quiet",
                suite,
                str(layer),
                mirror,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise BackendError.failure(
                    f"mmdebstrap failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}"
                )
            # mmdebstrap leaves the host's resolver config out; the sandbox has no
            # network by default, but tools expect the files to exist.
            for etc_file in ("etc/hostname", "etc/resolv.conf"):
                path = layer / etc_file
                if not path.exists() and not path.is_symlink():
                    path.write_text("")
            os.chmod(layer, 0o755)
            env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
            (staging / RECIPE_FILE).write_text(recipe)
            return store.commit(staging, name, ["0"], env, "/", replace=store.exists(name))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _built_from(store: ImageStore, name: str) -> str | None:
    """The recipe a stored image was built from, or None (absent, imported, or older)."""
    if not store.exists(name):
        return None
    try:
        return (store.folder_of(name) / RECIPE_FILE).read_text()
    except FileNotFoundError:
        return None


def import_image(
    images_dir: Path, source: Path, name: str, *, replace: bool = False
) -> StoredImage:
    """Import ``source`` into the store at ``images_dir`` as ``name`` (the CLI's entry point).

    The work is done by ``image_import.import_image`` (docker-save tars, OCI
    layouts, rootfs folders); this is the same call with the store first.
    """
    from .image_import import import_image as import_into_store

    return import_into_store(source, name, images_dir, replace=replace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchard.scheduler.backends.local.images")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build-default", help="build the default image (cached)")
    build.add_argument("--images-dir", type=Path, default=None)
    build.add_argument("--mirror", default=DEFAULT_MIRROR)
    importing = sub.add_parser(
        "import", help="import a docker-save tar, an OCI layout (tar or folder) or a rootfs folder"
    )
    importing.add_argument("source", type=Path)
    importing.add_argument("name")
    importing.add_argument("--replace", action="store_true")
    importing.add_argument("--images-dir", type=Path, default=None)
    listing = sub.add_parser("list", help="list the images in the store")
    listing.add_argument("--images-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    images_dir: Path = args.images_dir or _images_dir_from_env()
    if args.command == "build-default":
        started = time.monotonic()
        image = build_default_image(images_dir, mirror=args.mirror)
        print(
            f"{image.name}: {image.folder} ({image.size_bytes / 1e6:.0f} MB, "
            f"{time.monotonic() - started:.1f} s)"
        )
        return 0
    if args.command == "import":
        image = import_image(images_dir, args.source, args.name, replace=args.replace)
        print(f"{image.name}: {len(image.layers)} layers, {image.size_bytes} bytes")
        return 0
    for image in ImageStore(images_dir).list():
        print(f"{image.name}\t{len(image.layers)} layers\t{image.size_bytes} bytes")
    return 0


def _images_dir_from_env() -> Path:
    from .settings import LocalSettings

    return LocalSettings.from_env().image_store_dir


if __name__ == "__main__":
    sys.exit(main())
