"""The SDK's own tar writer and reader: what tarfile reads back, what it extracts, what it refuses."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from orchard import PathEscapeError
from orchard.client import _tar
from orchard.client._errors import InvalidRequestError

LONG = "x" * 120 + "/" + "y" * 90 + "/" + "z" * 99  # > 255 bytes: PAX fallback
MID = "m" * 120 + "/" + "n" * 90  # 211 bytes: ustar prefix/name split


def _tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_text("hello")
    (root / "empty.txt").write_bytes(b"")
    (root / "block.bin").write_bytes(b"q" * 512)
    (root / "big.bin").write_bytes(os.urandom(700_001))
    (root / "a" / "link").symlink_to("b/f.txt")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "ünï cödé.txt").write_text("utf8")
    for deep in (LONG, MID):
        (root / deep).parent.mkdir(parents=True, exist_ok=True)
        (root / deep).write_text(deep[-5:])
    os.mkfifo(root / "fifo")  # not copied


def _archive(root: Path) -> bytes:
    chunks = list(_tar.tar_stream(root))
    assert chunks and max(len(c) for c in chunks) <= 256 * 1024
    return b"".join(chunks)


def test_tarfile_reads_what_the_writer_makes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src)
    with tarfile.open(fileobj=io.BytesIO(_archive(src))) as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert archive.extractfile(members["big.bin"]).read() == (src / "big.bin").read_bytes()  # type: ignore[union-attr]
        assert archive.extractfile(members[LONG]).read() == LONG[-5:].encode()  # type: ignore[union-attr]
    assert "fifo" not in members
    assert members["a/link"].issym() and members["a/link"].linkname == "b/f.txt"
    assert members["run.sh"].mode == 0o755
    assert members["a/b"].isdir()
    assert members["ünï cödé.txt"].size == 4
    assert members[MID].size == 5


def test_round_trip_through_the_reader(tmp_path: Path) -> None:
    src = tmp_path / "top"
    _tree(src)
    # A download names members after the folder: tar the parent of "top".
    data = _archive_of_folder(src)
    out = tmp_path / "out"
    result = _tar.extract_stream((data[i : i + 777] for i in range(0, len(data), 777)), out)
    for rel in ("a/b/f.txt", "empty.txt", "block.bin", "big.bin", LONG, MID, "ünï cödé.txt"):
        assert (out / rel).read_bytes() == (src / rel).read_bytes(), rel
    assert os.readlink(out / "a" / "link") == "b/f.txt"
    assert stat.S_IMODE((out / "run.sh").stat().st_mode) == 0o755
    assert int((out / "big.bin").stat().st_mtime) == int((src / "big.bin").stat().st_mtime)
    assert result.members >= 10 and result.skipped_links == ()


def _archive_of_folder(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.add(folder, folder.name, filter=lambda m: None if m.isfifo() else m)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_reader_takes_every_tarfile_format(tmp_path: Path, fmt: int) -> None:
    buf = io.BytesIO()
    long_ok = fmt != tarfile.USTAR_FORMAT
    name = f"w/{LONG}" if long_ok else "w/short.txt"
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as archive:
        top = tarfile.TarInfo("w")
        top.type = tarfile.DIRTYPE
        archive.addfile(top)
        info = tarfile.TarInfo(name)
        info.size, info.mode = 3, 0o4777  # setuid and world-writable: filtered
        archive.addfile(info, io.BytesIO(b"abc"))
        hard = tarfile.TarInfo("w/hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, name
        archive.addfile(hard)
    out = tmp_path / "out"
    result = _tar.extract_stream([buf.getvalue()], out)
    rel = name.removeprefix("w/")
    assert (out / rel).read_bytes() == b"abc"
    assert stat.S_IMODE((out / rel).stat().st_mode) == 0o755
    assert (out / "hard").stat().st_ino == (out / rel).stat().st_ino
    assert result.members == 2


def _one(info: tarfile.TarInfo, data: bytes = b"") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        archive.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_special_files_are_refused(tmp_path: Path, kind: bytes) -> None:
    info = tarfile.TarInfo("dev")
    info.type = kind
    with pytest.raises(PathEscapeError, match="special"):
        _tar.extract_stream([_one(info)], tmp_path / "out")
    assert not (tmp_path / "out" / "dev").exists()


def test_a_folder_leading_outside_is_an_escape(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").symlink_to(outside)  # already there before the download
    info = tarfile.TarInfo("sub/evil")
    info.size = 1
    with pytest.raises(PathEscapeError, match="outside"):
        _tar.extract_stream([_one(info, b"x")], out)
    assert not (outside / "evil").exists()


def test_an_existing_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "f").symlink_to(victim)
    info = tarfile.TarInfo("f")
    info.size = 3
    _tar.extract_stream([_one(info, b"new")], out)
    assert victim.read_text() == "keep"
    assert not (out / "f").is_symlink() and (out / "f").read_text() == "new"


def test_links_escaping_by_dotdot_are_skipped(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        for name, target, kind in (
            ("up", "../../etc", tarfile.SYMTYPE),
            ("ok", "x/../y", tarfile.SYMTYPE),
            ("hard", "/etc/passwd", tarfile.LNKTYPE),
        ):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            archive.addfile(info)
    result = _tar.extract_stream([buf.getvalue()], tmp_path / "out")
    assert result.skipped_links == ("up", "hard")
    assert os.readlink(tmp_path / "out" / "ok") == "x/../y"


def test_malformed_streams_are_errors_not_crashes(tmp_path: Path) -> None:
    info = tarfile.TarInfo("f")
    info.size = 2000
    good = _one(info, os.urandom(2000))
    with pytest.raises(InvalidRequestError, match="truncated"):
        _tar.extract_stream([good[:1200]], tmp_path / "a")
    bad = bytearray(good)
    bad[0] ^= 0x55  # the checksum no longer matches
    with pytest.raises(InvalidRequestError, match="checksum"):
        _tar.extract_stream([bytes(bad)], tmp_path / "b")
    assert _tar.extract_stream([], tmp_path / "c").members == 0
