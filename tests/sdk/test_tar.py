"""Streaming tar: upload stream round-trips; download extraction refuses escapes."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from orchard import PathEscapeError
from orchard.client import _tar


def _tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("hello")
    (root / "big.bin").write_bytes(os.urandom(700_000))
    (root / "a" / "link").symlink_to("b/f.txt")


def test_upload_stream_is_chunked_and_complete(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src)
    chunks = list(_tar.tar_stream(src))
    assert max(len(c) for c in chunks) <= 256 * 1024
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
        names = sorted(archive.getnames())
    assert names == ["a", "a/b", "a/b/f.txt", "a/link", "big.bin"]


def test_download_strips_the_top_folder_and_keeps_content(tmp_path: Path) -> None:
    src = tmp_path / "work"
    _tree(src)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        archive.add(src, "work")
    data = buf.getvalue()
    out = tmp_path / "out"
    _tar.extract_stream((data[i : i + 999] for i in range(0, len(data), 999)), out)
    assert (out / "a" / "b" / "f.txt").read_text() == "hello"
    assert (out / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert os.readlink(out / "a" / "link") == "b/f.txt"


def test_download_skips_links_pointing_outside(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        info = tarfile.TarInfo("etc/os-release")
        info.type, info.linkname = tarfile.SYMTYPE, "/usr/lib/os-release"
        archive.addfile(info)
        ok = tarfile.TarInfo("etc/hostname")
        ok.size = 3
        archive.addfile(ok, io.BytesIO(b"box"))
    result = _tar.extract_stream([buf.getvalue()], tmp_path / "out")
    assert result == _tar.DownloadResult(1, ("etc/os-release",))
    assert not os.path.lexists(tmp_path / "out" / "etc" / "os-release")


@pytest.mark.parametrize("kind", ["dotdot", "absolute"])
def test_download_refuses_escaping_members(tmp_path: Path, kind: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        info = tarfile.TarInfo("../evil" if kind == "dotdot" else "/tmp/evil")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    out = tmp_path / "out"
    with pytest.raises(PathEscapeError):
        _tar.extract_stream([buf.getvalue()], out)
    assert not (tmp_path / "evil").exists()
