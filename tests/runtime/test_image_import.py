"""Image import: docker-save tars, OCI layouts (tar and folder), rootfs folders, hostile tars.

Layers are checked on disk (overlayfs whiteouts as char 0/0 devices, opaque
xattrs) and through a real overlay mount of the imported layers, which is
what a sandbox sees. Imports go to a temp store, never the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchard.scheduler.backends import BackendError, SandboxSpec
from orchard.scheduler.backends.local import images, overlay
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.image_import import import_image
from orchard.scheduler.backends.local.images import (
    ImageStore,
    image_folder_name,
    normalize_image_name,
)
from orchard.scheduler.backends.local.settings import LocalSettings

from .image_inputs import (
    LAYER_1,
    LAYER_2,
    docker_save_files,
    layer_tar,
    oci_layout_files,
    write_dir_of,
    write_tar_of,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts and mounts need root")


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "images"


@contextlib.contextmanager
def merged_view(layers: list[Path]) -> Iterator[Path]:
    """The layers mounted as overlayfs (lowest first), as a sandbox would see them."""
    scratch = Path(tempfile.mkdtemp(prefix="ovl-", dir="/tmp"))
    for sub in ("merged", "upper", "work"):
        (scratch / sub).mkdir()
    overlay.mount_overlay(scratch / "merged", layers, scratch / "upper", scratch / "work")
    try:
        yield scratch / "merged"
    finally:
        overlay.unmount_overlay(scratch / "merged")
        shutil.rmtree(scratch)


def check_two_layer_image(store_dir: Path, name: str) -> None:
    image = ImageStore(store_dir).get(name)
    assert image.layers == ["0", "1"]
    assert image.env["GREETING"] == "hi" and image.env["PATH"] == "/bin"
    assert image.cwd == "/data"
    assert image.size_bytes > 0
    lower, upper = image.layer_paths

    # On disk: layer 1 untouched by layer 2; whiteouts translated for overlayfs.
    assert (lower / "etc/hello").read_text() == "hello\n"
    assert os.stat(lower / "etc/hello-hardlink").st_ino == os.stat(lower / "etc/hello").st_ino
    assert os.readlink(lower / "etc/absolute-link") == "/etc/keep"
    assert os.stat(lower / "data/b").st_uid == 1000
    assert stat.S_IMODE(os.stat(lower / "bin/tool").st_mode) == 0o755
    whiteout = os.lstat(upper / "etc/hello")
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == os.makedev(0, 0)
    assert not (upper / "etc/.wh.hello").exists()
    assert os.getxattr(upper / "data", "trusted.overlay.opaque") == b"y"
    assert not (upper / "data/.wh..wh..opq").exists()

    # Through overlayfs: what a sandbox sees.
    with merged_view(image.layer_paths) as root:
        assert not (root / "etc/hello").exists()
        assert (root / "etc/keep").read_text() == "keep\n"
        assert (root / "etc/new").read_text() == "new\n"
        assert (root / "etc/hello-hardlink").read_text() == "hello\n"
        assert sorted(os.listdir(root / "data")) == ["c"]
        assert (root / "bin/tool").exists()


def test_image_names_are_sanitised() -> None:
    assert image_folder_name("debian:bookworm") == "debian+bookworm"
    assert normalize_image_name("tiny") == "tiny:latest"
    for bad in ("../x", "a/b", ".hidden", "UPPER", "", "x:../y", "a:b:c", "x\n"):
        with pytest.raises(BackendError) as err:
            image_folder_name(bad)
        assert err.value.client_fault


def test_import_docker_save_tar(store_dir: Path, tmp_path: Path) -> None:
    files = docker_save_files([layer_tar(LAYER_1), layer_tar(LAYER_2)])
    source = write_tar_of(files, tmp_path / "tiny.tar")
    image = import_image(source, "tiny:1", store_dir)
    assert image.name == "tiny:1" and image.folder == store_dir / "tiny+1"
    check_two_layer_image(store_dir, "tiny:1")
    # Importing the same name again is refused unless replacing.
    with pytest.raises(BackendError) as err:
        import_image(source, "tiny:1", store_dir)
    assert err.value.reason == "IMAGE_EXISTS"
    import_image(source, "tiny:1", store_dir, replace=True)
    check_two_layer_image(store_dir, "tiny:1")


@pytest.mark.parametrize("packaging", ["tar", "folder"])
@pytest.mark.parametrize("gzip_layers", [True, False], ids=["gzip", "plain"])
def test_import_oci_layout(
    store_dir: Path, tmp_path: Path, packaging: str, gzip_layers: bool
) -> None:
    files = oci_layout_files([layer_tar(LAYER_1), layer_tar(LAYER_2)], gzip_layers=gzip_layers)
    if packaging == "tar":
        source = write_tar_of(files, tmp_path / "oci.tar")
    else:
        source = write_dir_of(files, tmp_path / "oci")
    import_image(source, "tiny-oci:1", store_dir)
    check_two_layer_image(store_dir, "tiny-oci:1")


def test_oci_blob_with_wrong_digest_is_refused(store_dir: Path, tmp_path: Path) -> None:
    files = oci_layout_files([layer_tar(LAYER_1)], gzip_layers=False)
    layer_name = next(n for n, d in files.items() if n.startswith("blobs/") and b"hello" in d)
    files[layer_name] = layer_tar(LAYER_2)  # tampered layer
    with pytest.raises(BackendError) as err:
        import_image(write_dir_of(files, tmp_path / "oci"), "bad:1", store_dir)
    assert "digest" in err.value.message
    assert_store_clean(store_dir)


def test_import_rootfs_folder(store_dir: Path, tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/motd").write_text("hi\n")
    (rootfs / "etc/owned").write_text("x")
    os.chown(rootfs / "etc/owned", 1234, 1234)
    os.symlink("motd", rootfs / "etc/motd-link")
    # Through the images module's entry point, the one the CLI calls.
    image = images.import_image(store_dir, rootfs, "plain")
    assert image.name == "plain:latest" and image.layers == ["0"]
    layer = image.layer_paths[0]
    assert (layer / "etc/motd").read_text() == "hi\n"
    assert os.stat(layer / "etc/owned").st_uid == 1234
    assert os.readlink(layer / "etc/motd-link") == "motd"
    assert "/usr/bin" in image.env["PATH"] and image.cwd == "/"


def hostile_layer(kind: str, outside: Path) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:

        def add(info: tarfile.TarInfo, data: bytes = b"") -> None:
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if data else None)

        if kind == "absolute":
            add(tarfile.TarInfo(str(outside / "pwned")), b"x")
        elif kind == "dotdot":
            add(tarfile.TarInfo("a/../../pwned"), b"x")
        elif kind == "hardlink-out":
            link = tarfile.TarInfo("steal")
            link.type = tarfile.LNKTYPE
            link.linkname = "../../../../etc/passwd"
            add(link)
        elif kind == "symlink-then-write":
            link = tarfile.TarInfo("esc")
            link.type = tarfile.SYMTYPE
            link.linkname = str(outside)
            add(link)
            add(tarfile.TarInfo("esc/pwned"), b"x")
        elif kind == "hardlink-to-missing":
            link = tarfile.TarInfo("dangling")
            link.type = tarfile.LNKTYPE
            link.linkname = "not/there"
            add(link)
    return out.getvalue()


def assert_store_clean(store_dir: Path) -> None:
    leftovers = [p.name for p in store_dir.iterdir() if p.name != ".lock"]
    assert leftovers == []


@pytest.mark.parametrize(
    "kind", ["absolute", "dotdot", "hardlink-out", "symlink-then-write", "hardlink-to-missing"]
)
def test_hostile_layers_are_refused(store_dir: Path, tmp_path: Path, kind: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    files = docker_save_files([hostile_layer(kind, outside)])
    source = write_tar_of(files, tmp_path / "evil.tar")
    with pytest.raises(BackendError) as err:
        import_image(source, "evil:1", store_dir)
    assert err.value.client_fault and err.value.reason == "INVALID_IMAGE"
    assert list(outside.iterdir()) == []
    assert_store_clean(store_dir)


@pytest.mark.runc
def test_sandbox_from_an_imported_image(tmp_path: Path, home: Path, init_binary: Path) -> None:
    """A container over the imported layers: whiteouts hold, env and cwd come from the image."""
    store_dir = tmp_path / "images"
    files = docker_save_files([layer_tar(LAYER_1), layer_tar(LAYER_2)])
    import_image(write_tar_of(files, tmp_path / "tiny.tar"), "tiny:1", store_dir)
    settings = LocalSettings(
        home=home, images_dir=store_dir, init_binary=init_binary, default_image="tiny:1"
    )

    async def scenario() -> None:
        backend = LocalBackend(settings)
        try:
            made = await backend.create(SandboxSpec("tiny-1", env={"EXTRA": "1"}))
            root = Path(f"/proc/{made.init_pid}/root")
            assert await asyncio.to_thread(sorted, os.listdir(root / "data")) == ["c"]
            assert not await asyncio.to_thread((root / "etc/hello").exists)
            meta = await asyncio.to_thread((home / "sandboxes/tiny-1/sandbox.json").read_text)
            assert '"GREETING": "hi"' in meta and '"cwd": "/data"' in meta
            assert '"EXTRA": "1"' in meta
            await backend.delete("tiny-1")
            assert await backend.list() == []
        finally:
            await backend.close()

    asyncio.run(scenario())
