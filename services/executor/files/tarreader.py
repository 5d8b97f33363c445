"""A small streaming tar reader for Upload.

Why not ``tarfile`` ``r|*``: its stream mode parses a header in ~25 us (a
third of the per-file budget at 20k files/s), keeps every TarInfo it has seen
(a stream of a million tiny members keeps a million objects), reads PAX and
GNU long-name headers into memory whatever size they claim, and decompresses
without an output bound. This reader does one thing: yield members in order
and hand out their data as views of the incoming chunks (no copy on the way
to ``write``), trusting no size in a header beyond what the stream delivers.

Formats: v7, ustar, POSIX pax (per-file ``x`` and global ``g`` records:
path, linkpath, size, mtime, uid, gid) and GNU (``L``/``K`` long names,
base-256 numbers). Sparse and multi-volume members are reported with their
type so the caller can refuse them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from orchard.common.errors import invalid
from orchard.common.pax import parse_pax_records

from .decompress import Readable
from .fserrors import INVALID_FIELD

BLOCK = 512
MAX_META_BYTES = 1 << 20  # PAX records and GNU long names larger than this are refused
_ZERO_BLOCK = bytes(BLOCK)

REGULAR = (b"0", b"\0", b"7")
HARDLINK = b"1"
SYMLINK = b"2"
CHARDEV = b"3"
BLOCKDEV = b"4"
DIRECTORY = b"5"
FIFO = b"6"
_PAX = b"x"
_PAX_GLOBAL = b"g"
_GNU_LONGNAME = b"L"
_GNU_LONGLINK = b"K"


@dataclass
class TarMember:
    name: str
    kind: bytes
    size: int
    mode: int
    mtime: float
    linkname: str
    uid: int
    gid: int

    @property
    def is_regular(self) -> bool:
        return self.kind in REGULAR


def _malformed(message: str) -> Exception:
    return invalid(f"malformed tar stream: {message}", INVALID_FIELD)


def _text(field: bytes) -> str:
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode("utf-8", "surrogateescape")


def _number(field: bytes, what: str) -> int:
    """An octal field, or GNU base-256 (high bit of the first byte set)."""
    if field and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:  # negative
            value -= 1 << (8 * (len(field) - 1))
        return value
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise _malformed(f"bad {what} field {field!r}") from None


def _checksum_ok(block: bytes, stored: int) -> bool:
    """The header sum, with the checksum field counted as spaces (unsigned, or signed
    chars as some old tars computed it)."""
    unsigned = sum(block[:148]) + 256 + sum(block[156:])
    if unsigned == stored:
        return True
    high = sum(1 for b in block[:148] + block[156:] if b & 0x80)
    return unsigned - 256 * high == stored


def _parse_pax(data: bytes) -> dict[str, str]:
    try:
        return parse_pax_records(data)
    except ValueError as err:
        raise _malformed(str(err)) from None


class TarReader:
    """Members of a tar stream, in order; data read with :meth:`data` (or skipped)."""

    def __init__(self, source: Readable, read_size: int = 1 << 20) -> None:
        self._src = source
        self._read_size = read_size
        self._buf = b""
        self._pos = 0
        self._skip = 0  # unread data + padding of the current member
        self._pending = 0  # unread data of the current member
        self._global: dict[str, str] = {}

    # -- raw bytes ---------------------------------------------------------------

    def _take(self, limit: int) -> memoryview:
        """Up to ``limit`` bytes as a view of the current chunk; empty at the end."""
        if self._pos >= len(self._buf):
            self._buf = self._src.read(self._read_size)
            self._pos = 0
            if not self._buf:
                return memoryview(b"")
        start = self._pos
        end = min(len(self._buf), start + limit)
        self._pos = end
        return memoryview(self._buf)[start:end]

    def _exact(self, size: int, what: str) -> bytes:
        if self._pos + size <= len(self._buf):  # fast path: within the chunk
            start = self._pos
            self._pos += size
            return self._buf[start : self._pos]
        parts = []
        need = size
        while need:
            piece = self._take(need)
            if not piece:
                raise _malformed(f"the stream ended inside {what}")
            parts.append(bytes(piece))
            need -= len(piece)
        return b"".join(parts)

    def _discard(self, size: int) -> None:
        while size:
            piece = self._take(size)
            if not piece:
                raise _malformed("the stream ended inside a member's data")
            size -= len(piece)

    # -- members -------------------------------------------------------------------

    def data(self) -> Iterator[memoryview]:
        """The current member's data as views (valid until the next read)."""
        while self._pending:
            piece = self._take(self._pending)
            if not piece:
                raise _malformed("the stream ended inside a member's data")
            self._pending -= len(piece)
            self._skip -= len(piece)
            yield piece

    def next(self) -> TarMember | None:
        """The next member, None at the end-of-archive marker (or a clean EOF)."""
        if self._skip:
            self._discard(self._skip)
            self._skip = self._pending = 0
        overrides: dict[str, str] = {}
        while True:
            first = self._take(BLOCK)
            if not first:
                return None  # no end marker: accept, like GNU tar
            if len(first) < BLOCK:
                block = bytes(first) + self._exact(BLOCK - len(first), "a header")
            else:
                block = bytes(first)
            if block == _ZERO_BLOCK:
                return None
            member = self._header(block)
            meta_kind = member.kind
            if meta_kind not in (_PAX, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK):
                records = {**self._global, **overrides} if self._global else overrides
                if records:
                    self._apply(member, records)
                if member.kind == b"\0" and member.name.endswith("/"):
                    member.kind = DIRECTORY  # pre-POSIX tars mark directories this way
                self._pending = member.size
                self._skip = member.size + (-member.size % BLOCK)
                return member
            if member.size > MAX_META_BYTES:
                raise _malformed(f"an extended header of {member.size} bytes is too large")
            payload = self._exact(member.size, "an extended header")
            self._discard(-member.size % BLOCK)
            if meta_kind == _PAX:
                overrides.update(_parse_pax(payload))
            elif meta_kind == _PAX_GLOBAL:
                self._global.update(_parse_pax(payload))
            elif meta_kind == _GNU_LONGNAME:
                overrides["path"] = _text(payload)
            else:
                overrides["linkpath"] = _text(payload)

    def _header(self, block: bytes) -> TarMember:
        if not _checksum_ok(block, _number(block[148:156], "checksum")):
            raise _malformed("bad header checksum (not a tar stream?)")
        kind = block[156:157]
        name = _text(block[0:100])
        if block[257:262] == b"ustar" and block[263:265] != b" \0":  # POSIX, not old GNU
            prefix = _text(block[345:500])
            if prefix:
                name = f"{prefix}/{name}"
        member = TarMember(
            name=name,
            kind=kind,
            size=_number(block[124:136], "size"),
            mode=_number(block[100:108], "mode") & 0o7777,
            mtime=float(_number(block[136:148], "mtime")),
            linkname=_text(block[157:257]),
            uid=_number(block[108:116], "uid"),
            gid=_number(block[116:124], "gid"),
        )
        if member.size < 0:
            raise _malformed(f"negative size in member {name!r}")
        return member

    @staticmethod
    def _apply(member: TarMember, records: dict[str, str]) -> None:
        try:
            if "path" in records:
                member.name = records["path"]
            if "linkpath" in records:
                member.linkname = records["linkpath"]
            if "size" in records:
                member.size = int(records["size"])
            if "mtime" in records:
                member.mtime = float(records["mtime"])
            if "uid" in records:
                member.uid = int(records["uid"])
            if "gid" in records:
                member.gid = int(records["gid"])
        except ValueError:
            raise _malformed(f"bad pax value in member {member.name!r}") from None
        if member.size < 0:
            raise _malformed(f"negative size in member {member.name!r}")
