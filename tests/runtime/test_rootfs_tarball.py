"""Image import of rootfs tarballs (``docker export`` output), plain and compressed.

The tarballs are made here (a static busybox, its links, a hard link, /etc
files, a device node as docker export has under /dev), imported through the
CLI's entry point and the ``orchard image import`` command, checked on disk,
and one is booted as a real runc sandbox and driven through a real executor.
Hostile tarballs (absolute names, ``..``, hard links out, device nodes,
symlink-then-write) are refused or neutralised and leave nothing behind.
"""

from __future__ import annotations

import asyncio
import bz2
import gzip
import io
import lzma
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from orchard.scheduler.backends import BackendError, SandboxSpec
from orchard.scheduler.backends.local import images
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.settings import LocalSettings

from .test_image_import import assert_store_clean, hostile_layer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="owners and device nodes need root")

BUSYBOX = Path("/bin/busybox")


def _add(tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, **kw: object) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    data = kw.pop("data", b"")
    assert isinstance(data, bytes)
    for key, value in kw.items():
        setattr(info, key, value)
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def export_tar() -> bytes:
    """What ``docker export`` of a tiny busybox container looks like."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, ".dockerenv", data=b"")
        for folder in ("bin/", "dev/", "etc/", "tmp/", "work/"):
            _add(tar, folder, tarfile.DIRTYPE, mode=0o755)
        _add(tar, "bin/busybox", data=BUSYBOX.read_bytes(), mode=0o755)
        for applet in ("sh", "cat", "ls", "id", "true"):
            _add(tar, f"bin/{applet}", tarfile.SYMTYPE, linkname="busybox")
        _add(
            tar,
            "etc/passwd",
            data=b"root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/work:/bin/sh\n",
        )
        _add(tar, "etc/group", data=b"root:x:0:\nagent:x:1000:\n")
        _add(tar, "etc/motd", data=b"exported\n", uid=1000, gid=1000, mode=0o640)
        _add(tar, "etc/motd-hard", tarfile.LNKTYPE, linkname="etc/motd")
        _add(tar, "dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666)
        _add(tar, "tmp/", tarfile.DIRTYPE, mode=0o1777)
    return out.getvalue()


def _compress(data: bytes, how: str, path: Path) -> Path:
    if how == "zstd":
        if shutil.which("zstd") is None:
            pytest.skip("needs the zstd program")
        path.write_bytes(data)
        subprocess.run(["zstd", "-q", "-f", "--rm", str(path), "-o", f"{path}.zst"], check=True)
        return Path(f"{path}.zst")
    packed = {
        "none": lambda d: d,
        "gzip": gzip.compress,
        "bzip2": bz2.compress,
        "xz": lzma.compress,
    }[how](data)
    path.write_bytes(packed)
    return path


@pytest.mark.parametrize("how", ["none", "gzip", "bzip2", "xz", "zstd"])
def test_import_rootfs_tarball(tmp_path: Path, how: str) -> None:
    store_dir = tmp_path / "images"
    source = _compress(export_tar(), how, tmp_path / "rootfs.tar")
    image = images.import_image(store_dir, source, f"exported:{how}")
    assert image.layers == ["0"] and image.cwd == "/" and "/bin" in image.env["PATH"]
    layer = image.layer_paths[0]
    assert (layer / "bin/busybox").read_bytes() == BUSYBOX.read_bytes()
    assert os.readlink(layer / "bin/sh") == "busybox"
    motd = os.stat(layer / "etc/motd")
    assert (motd.st_uid, stat.S_IMODE(motd.st_mode)) == (1000, 0o640)
    assert os.stat(layer / "etc/motd-hard").st_ino == motd.st_ino
    assert stat.S_IMODE(os.stat(layer / "tmp").st_mode) == 0o1777
    assert not os.path.lexists(layer / "dev/null")  # device nodes are neutralised (skipped)


def test_cli_imports_a_rootfs_tarball(tmp_path: Path) -> None:
    store_dir = tmp_path / "images"
    source = _compress(export_tar(), "gzip", tmp_path / "rootfs.tar.gz")
    done = subprocess.run(
        [sys.executable, "-m", "orchard.cli", "image", "import", str(source), "--name", "cli:1",
         "--images-dir", str(store_dir)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cli:1"
    assert (images.ImageStore(store_dir).get("cli:1").layer_paths[0] / "etc/motd").exists()


@pytest.mark.parametrize(
    "kind", ["absolute", "dotdot", "hardlink-out", "symlink-then-write", "hardlink-to-missing"]
)
@pytest.mark.parametrize("how", ["none", "zstd"])
def test_hostile_rootfs_tarballs_are_refused(tmp_path: Path, kind: str, how: str) -> None:
    store_dir = tmp_path / "images"
    outside = tmp_path / "outside"
    outside.mkdir()
    source = _compress(hostile_layer(kind, outside), how, tmp_path / "evil.tar")
    with pytest.raises(BackendError) as err:
        images.import_image(store_dir, source, "evil:1")
    assert err.value.client_fault and err.value.reason == "INVALID_IMAGE"
    assert list(outside.iterdir()) == []
    assert_store_clean(store_dir)


def test_a_truncated_or_corrupt_tarball_is_refused(tmp_path: Path) -> None:
    store_dir = tmp_path / "images"
    data = _compress(export_tar(), "zstd", tmp_path / "t.tar").read_bytes()
    (tmp_path / "cut.tar.zst").write_bytes(data[: len(data) // 2])
    with pytest.raises(BackendError) as err:
        images.import_image(store_dir, tmp_path / "cut.tar.zst", "cut:1")
    assert err.value.reason == "INVALID_IMAGE"
    (tmp_path / "junk").write_bytes(b"not an archive at all" * 100)
    with pytest.raises(BackendError):
        images.import_image(store_dir, tmp_path / "junk", "junk:1")
    assert_store_clean(store_dir)


@pytest.mark.runc
def test_a_sandbox_boots_from_an_exported_rootfs(
    tmp_path: Path, home: Path, init_binary: Path
) -> None:
    """The zstd tarball as a real runc sandbox, a command run in it by a real executor."""
    from tests.executor.harness import Client, ExecutorProcess

    store_dir = tmp_path / "images"
    images.import_image(store_dir, _compress(export_tar(), "zstd", tmp_path / "r.tar"), "bb:1")
    settings = LocalSettings(
        home=home, images_dir=store_dir, init_binary=init_binary, default_image="bb:1"
    )

    async def scenario() -> None:
        backend = LocalBackend(settings)
        try:
            await backend.create(SandboxSpec("bb-1"))
            executor = await asyncio.to_thread(ExecutorProcess.start, home)
            client = Client(executor.address, home)
            try:
                r = await asyncio.to_thread(
                    client.run, "bb-1", argv=["sh", "-c", "cat /etc/motd; id -u; ls /dev/null"]
                )
                assert r.stdout.startswith(b"exported\n0\n"), r
            finally:
                client.close()
                executor.stop()
            await backend.delete("bb-1")
        finally:
            await backend.close()

    asyncio.run(scenario())
