"""HTTP/1.x requests as the egress proxy reads them: one head at a time and
exactly its body, so every request on a kept-alive connection is its own
request, checked on its own.

Parsed strictly (RFC 9112): a head or a framing that two parsers could read
differently (whitespace before a colon, folded lines, two Host headers,
Content-Length with Transfer-Encoding, a coding other than ``chunked``) is
refused with 400 rather than guessed, since the server behind the proxy
might read it the other way and see a request the proxy never checked.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from .destinations import Refused

# Not forwarded: hop-by-hop, and Expect (the proxy answers 100-continue itself).
HOP_BY_HOP = frozenset(
    (
        "connection",
        "proxy-connection",
        "proxy-authorization",
        "keep-alive",
        "te",
        "upgrade",
        "expect",
    )
)
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
MAX_CHUNK_LINE = 1024


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name]

    @property
    def host(self) -> str | None:
        found = self.header("host")
        if len(found) > 1:
            raise Refused(400, "more than one Host header")
        return found[0] if found else None

    @property
    def wants_close(self) -> bool:
        tokens = {t.strip().lower() for v in self.header("connection") for t in v.split(",")}
        return "close" in tokens or (self.version == "HTTP/1.0" and "keep-alive" not in tokens)


def parse_head(head: bytes) -> RequestHead:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1") or not _TOKEN.match(parts[0]):
        raise Refused(400, "malformed request line")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise Refused(400, f"malformed header line {line[:60]!r}")
        headers.append((name, value.strip(" \t")))
    return RequestHead(parts[0], parts[1], parts[2], tuple(headers))


def forwarded_head(request: RequestHead, path: str) -> bytes:
    """The head sent upstream: origin-form, hop-by-hop headers dropped, ``Connection: close``
    (one request per upstream connection, so the response ends where the server closes)."""
    named = {t.strip().lower() for v in request.header("connection") for t in v.split(",")}
    kept = [
        f"{k}: {v}"
        for k, v in request.headers
        if k.lower() not in HOP_BY_HOP and k.lower() not in named
    ]
    lines = [f"{request.method} {path} {request.version}", *kept, "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def body_length(request: RequestHead) -> int | None:
    """Content-Length, 0 for no body, None for a chunked body; Refused(400) when ambiguous."""
    codings = [t.strip().lower() for v in request.header("transfer-encoding") for t in v.split(",")]
    lengths = request.header("content-length")
    if codings:
        if lengths:
            raise Refused(400, "both Content-Length and Transfer-Encoding (request smuggling)")
        if codings != ["chunked"]:
            raise Refused(400, "only Transfer-Encoding: chunked is accepted on requests")
        return None
    if not lengths:
        return 0
    if len(set(lengths)) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
        raise Refused(400, "bad Content-Length")
    return int(lengths[0])


async def copy_body(
    request: RequestHead,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    idle: float,
) -> None:
    """Copy exactly the request's body (and no byte of the next request) to ``writer``."""
    length = body_length(request)
    if length is not None:
        await _copy_exactly(reader, writer, length, idle)
        return
    while True:
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), idle)
        size_text = line[:-2].split(b";", 1)[0].strip()
        if len(line) > MAX_CHUNK_LINE or not size_text or len(size_text) > 15:
            raise Refused(400, "bad chunk size line")
        try:
            size = int(size_text, 16)
        except ValueError:
            raise Refused(400, "bad chunk size line") from None
        writer.write(line)
        if size == 0:
            break
        await _copy_exactly(reader, writer, size, idle)
        if await asyncio.wait_for(reader.readexactly(2), idle) != b"\r\n":
            raise Refused(400, "chunk not followed by CRLF")
        writer.write(b"\r\n")
    while True:  # trailers, up to the empty line
        line = await asyncio.wait_for(reader.readuntil(b"\r\n"), idle)
        writer.write(line)
        if line == b"\r\n":
            break
    await writer.drain()


async def _copy_exactly(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int, idle: float
) -> None:
    while size > 0:
        data = await asyncio.wait_for(reader.read(min(size, 64 * 1024)), idle)
        if not data:
            raise asyncio.IncompleteReadError(b"", size)
        size -= len(data)
        writer.write(data)
        await asyncio.wait_for(writer.drain(), idle)
