"""Building tar streams for tests, including the hostile ones tarfile itself would not write."""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Member:
    name: str
    kind: bytes = tarfile.REGTYPE
    data: bytes = b""
    linkname: str = ""
    mode: int = 0o644
    mtime: int = 1_600_000_000
    extra: dict[str, str] = field(default_factory=dict)


def build(members: list[Member], *, compression: str = "") -> bytes:
    buf = io.BytesIO()
    mode: Any = f"w:{compression}"  # one of w:, w:gz, w:bz2, w:xz
    with tarfile.open(fileobj=buf, mode=mode, format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.type = m.kind
            info.mode = m.mode
            info.mtime = m.mtime
            info.linkname = m.linkname
            info.pax_headers = m.extra
            if m.kind == tarfile.REGTYPE:
                info.size = len(m.data)
                tar.addfile(info, io.BytesIO(m.data))
            else:
                tar.addfile(info)
    return buf.getvalue()


def split(data: bytes, size: int = 65536) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def parse(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def contents(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        out = {}
        for m in tar.getmembers():
            if m.isreg():
                f = tar.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
        return out
