"""The streaming tar reader against archives written by tarfile, in every format."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orchard.executor.files.tarreader import TarReader

from orchard.common.errors import ServiceError


class Chunked:
    """A readable that hands out ``data`` in pieces of ``size`` (like gRPC chunks)."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size, self.pos = data, size, 0

    def read(self, n: int = -1, /) -> bytes:
        out = self.data[self.pos : self.pos + min(n if n > 0 else self.size, self.size)]
        self.pos += len(out)
        return out


def read_all(data: bytes, size: int = 700) -> list[tuple[str, bytes, int, bytes, str, int]]:
    reader = TarReader(Chunked(data, size), read_size=size)
    out = []
    while (m := reader.next()) is not None:
        body = b"".join(bytes(p) for p in reader.data()) if m.is_regular else b""
        out.append((m.name.rstrip("/"), m.kind, m.size, body, m.linkname, m.uid))
    return out


def expected(data: bytes) -> list[tuple[str, bytes, int, bytes, str, int]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar:
            f = tar.extractfile(m) if m.isreg() else None
            body = f.read() if f is not None else b""
            kind = m.type if m.type != tarfile.AREGTYPE else tarfile.REGTYPE
            out.append((m.name, kind, m.size, body, m.linkname, m.uid))
    return out


def build(fmt: int, entries: list[tuple[str, bytes, bytes, str, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, kind, data, link, uid in entries:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.uid = kind, link, uid
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return buf.getvalue()


LONG = "d" * 120 + "/" + "n" * 140


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_formats(fmt: int) -> None:
    entries = [
        ("a/", tarfile.DIRTYPE, b"", "", 0),
        ("a/f", tarfile.REGTYPE, b"hello" * 300, "", 1000),
        ("a/l", tarfile.SYMTYPE, b"", "f", 0),
        ("a/h", tarfile.LNKTYPE, b"", "a/f", 0),
        ("d" * 90 + "/" + "e" * 90, tarfile.REGTYPE, b"split name", "", 0),
    ]
    if fmt != tarfile.USTAR_FORMAT:
        entries += [
            (LONG, tarfile.REGTYPE, b"long", "", 0),
            ("ln", tarfile.SYMTYPE, b"", "t" * 200, 0),
            ("big-uid", tarfile.REGTYPE, b"x", "", 2**40),
            ("naïve-ünïcode", tarfile.REGTYPE, b"u", "", 0),
        ]
    data = build(fmt, entries)
    assert read_all(data) == expected(data)


def test_global_pax_header_applies_to_following_members() -> None:
    buf = io.BytesIO()
    with tarfile.open(
        fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"uid": "77"}
    ) as tar:
        info = tarfile.TarInfo("f")
        tar.addfile(info, io.BytesIO(b""))
    [(name, _, _, _, _, uid)] = read_all(buf.getvalue())
    assert (name, uid) == ("f", 77)


def test_unread_data_is_skipped() -> None:
    data = build(tarfile.PAX_FORMAT, [("a", b"0", b"x" * 5000, "", 0), ("b", b"0", b"y", "", 0)])
    reader = TarReader(Chunked(data, 333), read_size=333)
    first = reader.next()
    assert first is not None and first.name == "a"
    second = reader.next()
    assert second is not None and second.name == "b"
    assert b"".join(bytes(p) for p in reader.data()) == b"y"
    assert reader.next() is None


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b[:100] + b"\xff" + b[101:],  # checksum no longer matches
        lambda b: b[:700],  # ends inside the data
        lambda b: b[:300],  # ends inside the header
        lambda b: b"x" * 1024,  # not tar at all
    ],
)
def test_malformed_streams(mutate: object) -> None:
    data = build(tarfile.USTAR_FORMAT, [("f", b"0", b"z" * 1000, "", 0)])
    bad = mutate(data)  # type: ignore[operator]
    with pytest.raises(ServiceError) as info:
        read_all(bad)
    assert info.value.reason == "INVALID_FIELD"


_names = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\0/"),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.lists(_names, min_size=1, max_size=4), st.binary(max_size=3000))),
    st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    st.integers(min_value=1, max_value=4096),
)
def test_same_members_as_tarfile(
    files: list[tuple[list[str], bytes]], fmt: int, chunk: int
) -> None:
    entries = [("/".join(parts), tarfile.REGTYPE, body, "", 0) for parts, body in files]
    data = build(fmt, entries)
    assert read_all(data, chunk) == expected(data)


def test_old_style_directory_entry() -> None:
    """A pre-POSIX archive marks a directory as an AREGTYPE member named "d/"."""
    info = tarfile.TarInfo("d/")
    info.type = tarfile.AREGTYPE
    block = info.tobuf(tarfile.USTAR_FORMAT)
    assert block[156:157] == b"\0"
    reader = TarReader(Chunked(block + bytes(1024), 512))
    member = reader.next()
    assert member is not None
    assert (member.name, member.kind) == ("d/", tarfile.DIRTYPE)
