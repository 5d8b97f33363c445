"""Just enough DNS (RFC 1035) for the forwarder and the proxy's own lookups.

``parse_query`` reads the one question a stub resolver asks; ``answer``
builds the reply (A records, NXDOMAIN, REFUSED or an empty NOERROR);
``Resolver`` asks the upstream server for A records over UDP, follows
nothing itself (a recursive upstream returns the CNAME chain with the
addresses) and caches answers for their TTL (at most five minutes). Each
upstream query has its own socket (a random source port, so a forged answer
must guess it as well as the query id), and at most ``max_upstream`` are
open at once, node-wide; concurrent queries for one name share one upstream
query. An upstream that fails (silence past the timeout, SERVFAIL, REFUSED) is
``lookup``'s None, which the forwarder answers SERVFAIL, at once and never
cached. Hostile input raises ``DnsError``; the caller drops the packet.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import struct
import time
from dataclasses import dataclass

TYPE_A = 1
CLASS_IN = 1
RCODE_NXDOMAIN = 3
RCODE_SERVFAIL = 2
RCODE_REFUSED = 5
MAX_CACHE_SECONDS = 300
MAX_CACHE_ENTRIES = 4096


class DnsError(ValueError):
    pass


@dataclass(frozen=True)
class Query:
    id: int
    name: str
    qtype: int
    qclass: int
    question: bytes
    """The question section as received (echoed in the answer)."""


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    """A possibly compressed name at ``offset``; returns it and the offset after it."""
    labels: list[str] = []
    end = -1
    jumps = 0
    while True:
        if offset >= len(data):
            raise DnsError("name runs past the message")
        length = data[offset]
        if length & 0xC0 == 0xC0:
            if offset + 1 >= len(data) or jumps > 16:
                raise DnsError("bad compression pointer")
            if end < 0:
                end = offset + 2
            offset = ((length & 0x3F) << 8) | data[offset + 1]
            jumps += 1
            continue
        if length & 0xC0:
            raise DnsError("unsupported label type")
        offset += 1
        if length == 0:
            break
        label = data[offset : offset + length]
        if len(label) != length:
            raise DnsError("label runs past the message")
        labels.append(label.decode("ascii", "replace").lower())
        offset += length
    name = ".".join(labels)
    if len(name) > 253:
        raise DnsError("name too long")
    return name, (end if end >= 0 else offset)


def parse_query(data: bytes) -> Query:
    if len(data) < 12:
        raise DnsError("short header")
    qid, flags, qdcount = struct.unpack("!HHH", data[:6])
    if flags & 0x8000 or qdcount != 1:
        raise DnsError("not a single-question query")
    name, offset = _read_name(data, 12)
    if offset + 4 > len(data):
        raise DnsError("short question")
    qtype, qclass = struct.unpack("!HH", data[offset : offset + 4])
    return Query(qid, name, qtype, qclass, data[12 : offset + 4])


def answer(
    query: Query, addresses: list[ipaddress.IPv4Address], rcode: int = 0, ttl: int = 30
) -> bytes:
    """The reply: ``addresses`` as A records (for an A question), else no records."""
    records = addresses if (query.qtype == TYPE_A and query.qclass == CLASS_IN) else []
    header = struct.pack("!HHHHHH", query.id, 0x8180 | rcode, 1, len(records), 0, 0)
    body = b"".join(
        struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, ttl, 4) + a.packed for a in records
    )
    return header + query.question + body


def encode_name(name: str) -> bytes:
    out = b""
    for label in name.split("."):
        raw = label.encode("ascii")
        if not 0 < len(raw) < 64:
            raise DnsError(f"bad label in {name!r}")
        out += bytes([len(raw)]) + raw
    return out + b"\x00"


def a_query(qid: int, name: str) -> bytes:
    return (
        struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0)
        + encode_name(name)
        + struct.pack("!HH", TYPE_A, CLASS_IN)
    )


def parse_a_answer(data: bytes, qid: int) -> tuple[list[ipaddress.IPv4Address], int, int]:
    """(A addresses, smallest TTL, rcode) from an upstream reply to query ``qid``."""
    if len(data) < 12:
        raise DnsError("short reply")
    rid, flags, qdcount, ancount = struct.unpack("!HHHH", data[:8])
    if rid != qid or not flags & 0x8000:
        raise DnsError("not our reply")
    offset = 12
    for _ in range(qdcount):
        _, offset = _read_name(data, offset)
        offset += 4
    found: list[ipaddress.IPv4Address] = []
    ttl = MAX_CACHE_SECONDS
    for _ in range(ancount):
        _, offset = _read_name(data, offset)
        if offset + 10 > len(data):
            raise DnsError("short record")
        rtype, rclass, rttl, rdlen = struct.unpack("!HHIH", data[offset : offset + 10])
        offset += 10
        rdata = data[offset : offset + rdlen]
        offset += rdlen
        if rtype == TYPE_A and rclass == CLASS_IN and len(rdata) == 4:
            found.append(ipaddress.IPv4Address(rdata))
            ttl = min(ttl, rttl)
    return found, ttl, flags & 0xF


class _OneShot(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        if not self.reply.done():
            self.reply.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.reply.done():
            self.reply.set_exception(exc)


class Resolver:
    """A records from one upstream server, cached for their TTL."""

    def __init__(
        self, upstream: tuple[str, int], timeout: float = 2.0, max_upstream: int = 256
    ) -> None:
        self.upstream = upstream
        self.timeout = timeout
        self._slots = asyncio.Semaphore(max_upstream)
        self._cache: dict[str, tuple[float, list[ipaddress.IPv4Address]]] = {}
        self._asking: dict[str, asyncio.Future[list[ipaddress.IPv4Address] | None]] = {}

    async def resolve(self, name: str) -> list[ipaddress.IPv4Address]:
        """The name's IPv4 addresses; [] when it has none or the upstream fails."""
        return await self.lookup(name) or []

    async def lookup(self, name: str) -> list[ipaddress.IPv4Address] | None:
        """The name's IPv4 addresses ([] = it has none), or None when the upstream did not
        answer in time or answered a failure (the forwarder answers SERVFAIL then, not a
        NXDOMAIN a stub resolver would believe and cache). Failures are not cached."""
        cached = self._cache.get(name)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        asking = self._asking.get(name)
        if asking is not None:
            return await asyncio.shield(asking)
        future: asyncio.Future[list[ipaddress.IPv4Address] | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._asking[name] = future
        try:
            found = await self._ask(name)
        except BaseException:
            future.set_result(None)  # whoever shares this query sees a failed lookup
            raise
        finally:
            del self._asking[name]
        future.set_result(found)
        return found

    async def _ask(self, name: str) -> list[ipaddress.IPv4Address] | None:
        qid = int.from_bytes(os.urandom(2), "big")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout), self._slots:
                transport, protocol = await loop.create_datagram_endpoint(
                    _OneShot, remote_addr=self.upstream
                )
                try:
                    transport.sendto(a_query(qid, name))
                    addresses, ttl, rcode = parse_a_answer(await protocol.reply, qid)
                finally:
                    transport.close()
        except (TimeoutError, OSError, DnsError):
            return None
        if rcode not in (0, RCODE_NXDOMAIN):
            return None  # SERVFAIL, REFUSED, ...: the upstream failed, the name may exist
        now = time.monotonic()
        if len(self._cache) >= MAX_CACHE_ENTRIES:
            self._cache.clear()
        self._cache[name] = (now + min(ttl, MAX_CACHE_SECONDS), addresses)
        return addresses
