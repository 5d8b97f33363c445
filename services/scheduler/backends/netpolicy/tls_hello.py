"""The TLS ClientHello at the start of a CONNECT tunnel, reassembled and read.

A client may split its ClientHello over as many TCP segments and TLS records
as it likes (RFC 8446 5.1: handshake messages may be fragmented across
records), so a check on the first bytes received proves nothing.
``read_client_hello`` reads whole records until the handshake message is
complete (bounded in bytes and in time) and returns every byte it read, to be
forwarded unchanged once the server name is checked. Anything that is not a
well-formed ClientHello is refused (:class:`HelloError`): the tunnel closes
before a byte reaches the server. Parsed strictly, because a server that
reads a message differently from us (a second server_name extension, a list
of two names, trailing bytes) would answer for a name we never checked.
"""

from __future__ import annotations

import asyncio
import struct

RECORD_HANDSHAKE = 0x16
HANDSHAKE_CLIENT_HELLO = 0x01
EXT_SERVER_NAME = 0
MAX_RECORD = 2**14 + 256  # TLSPlaintext is at most 2^14; a little slack for old clients


class HelloError(ValueError):
    """Not a well-formed ClientHello; the message says what is wrong."""


async def read_client_hello(
    reader: asyncio.StreamReader, max_bytes: int, seconds: float
) -> tuple[bytes, str | None]:
    """(every byte read, the server name or None), or :class:`HelloError`."""
    raw = bytearray()
    message = bytearray()
    try:
        async with asyncio.timeout(seconds):
            while True:
                header = await reader.readexactly(5)
                if header[0] != RECORD_HANDSHAKE or header[1] != 3:
                    raise HelloError("the tunnel does not start with a TLS handshake")
                (length,) = struct.unpack("!H", header[3:5])
                if not 0 < length <= MAX_RECORD:
                    raise HelloError(f"TLS record of {length} bytes")
                raw += header + await reader.readexactly(length)
                message += raw[-length:]
                if len(raw) > max_bytes:
                    raise HelloError(f"ClientHello larger than {max_bytes} bytes")
                if len(message) < 4:
                    continue
                if message[0] != HANDSHAKE_CLIENT_HELLO:
                    raise HelloError("the first handshake message is not a ClientHello")
                total = 4 + int.from_bytes(message[1:4], "big")
                if total > max_bytes:
                    raise HelloError(f"ClientHello larger than {max_bytes} bytes")
                if len(message) > total:
                    raise HelloError("bytes after the ClientHello in its records")
                if len(message) == total:
                    return bytes(raw), server_name(bytes(message[4:]))
    except TimeoutError:
        raise HelloError(f"no whole ClientHello within {seconds:g} s") from None
    except asyncio.IncompleteReadError:
        raise HelloError("the tunnel closed inside the ClientHello") from None


def server_name(body: bytes) -> str | None:
    """The host_name of a ClientHello body (after the handshake header), or None."""
    try:
        pos = 2 + 32  # legacy_version, random
        pos = _skip(body, pos, 1, 32)  # legacy_session_id
        pos = _skip(body, pos, 2)  # cipher_suites
        pos = _skip(body, pos, 1)  # legacy_compression_methods
        if pos == len(body):
            return None  # no extensions at all
        (ext_total,) = struct.unpack_from("!H", body, pos)
        pos += 2
        if pos + ext_total != len(body):
            raise HelloError("the extensions do not fill the ClientHello")
        seen: set[int] = set()
        name: str | None = None
        while pos < len(body):
            ext_type, ext_len = struct.unpack_from("!HH", body, pos)
            pos += 4
            data = body[pos : pos + ext_len]
            if len(data) != ext_len:
                raise HelloError("an extension runs past the ClientHello")
            pos += ext_len
            if ext_type in seen:
                raise HelloError(f"extension {ext_type} appears twice")
            seen.add(ext_type)
            if ext_type == EXT_SERVER_NAME:
                name = _host_name(data)
        return name
    except (struct.error, IndexError):
        raise HelloError("truncated ClientHello") from None


def _skip(data: bytes, pos: int, size_bytes: int, most: int = 1 << 16) -> int:
    """The position after a vector of ``size_bytes``-byte length at ``pos``."""
    length = int.from_bytes(data[pos : pos + size_bytes], "big")
    end = pos + size_bytes + length
    if len(data[pos:pos + size_bytes]) != size_bytes or length > most or end > len(data):  # fmt: skip
        raise HelloError("a field runs past the ClientHello")
    return end


def _host_name(data: bytes) -> str:
    (list_len,) = struct.unpack_from("!H", data, 0)
    if list_len + 2 != len(data) or list_len < 3:
        raise HelloError("malformed server_name extension")
    name_type, name_len = struct.unpack_from("!BH", data, 2)
    if name_type != 0 or 5 + name_len != len(data) or name_len == 0:
        raise HelloError("server_name must hold exactly one host_name")
    raw = data[5:]
    if not raw.isascii():
        raise HelloError("server_name is not ASCII")
    return raw.decode("ascii")
