"""The egress proxy: an HTTP proxy (CONNECT and absolute-form requests) and a
DNS forwarder, both judging each request by the sandbox it comes from.

The sandbox is known by its source address on the bridge (spoofing is dropped
at layer 2, see ``nftables``). The proxy never trusts what the client says
the destination *is*: it takes the name from the request line, checks it
against the sandbox's policy, resolves it **itself** and connects to an
address that the policy also allows (no private or host addresses behind an
allowed name: DNS rebinding gets nowhere). A ``Host`` header that names
another host than the request line is refused, and so is a TLS ClientHello
in a CONNECT tunnel whose SNI names another host than the CONNECT target.
The DNS forwarder answers allowed names only (NXDOMAIN otherwise) with the
addresses the proxy itself would use; IPv4 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import structlog

from . import dns
from .policy import NetworkPolicySpec

log = structlog.get_logger("orchard.netpolicy.proxy")

MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT = 10.0
CONNECT_TIMEOUT = 10.0
RELAY_CHUNK = 64 * 1024


class Refused(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status
        self.why = why


@dataclass
class _Client:
    policy: NetworkPolicySpec
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class EgressProxy:
    """One per backend process; ``set_policy``/``forget`` as sandboxes come and go."""

    def __init__(
        self, bind: str, resolver: dns.Resolver, proxy_port: int = 0, dns_port: int = 0
    ) -> None:
        self.bind = bind
        self.resolver = resolver
        self._clients: dict[ipaddress.IPv4Address, _Client] = {}
        self._server: asyncio.Server | None = None
        self._dns: asyncio.DatagramTransport | None = None
        # 0 = a free port (the local runtime); fixed ports behind a Kubernetes Service.
        self.proxy_port = proxy_port
        self.dns_port = dns_port

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve_http, self.bind, self.proxy_port)
        self.proxy_port = self._server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _DnsForwarder(self), local_addr=(self.bind, self.dns_port)
        )
        self._dns = transport
        self.dns_port = transport.get_extra_info("sockname")[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._dns is not None:
            self._dns.close()
        for address in list(self._clients):
            self.forget(address)

    # -- policies ------------------------------------------------------------

    def set_policy(self, address: ipaddress.IPv4Address, policy: NetworkPolicySpec) -> None:
        """Install ``policy`` for ``address``; tunnels opened under the old one are closed."""
        old = self._clients.get(address)
        self._clients[address] = _Client(policy)
        if old is not None:
            for task in old.tasks:
                task.cancel()

    def forget(self, address: ipaddress.IPv4Address) -> None:
        old = self._clients.pop(address, None)
        if old is not None:
            for task in old.tasks:
                task.cancel()

    def policy_of(self, host: str) -> NetworkPolicySpec | None:
        with contextlib.suppress(ValueError):
            client = self._clients.get(ipaddress.IPv4Address(host))
            return None if client is None else client.policy
        return None

    @property
    def clients(self) -> int:
        return len(self._clients)

    # -- destination checks --------------------------------------------------

    async def destination(
        self, policy: NetworkPolicySpec, host: str, port: int
    ) -> ipaddress.IPv4Address:
        """The address to connect to for ``host:port``, or :class:`Refused`."""
        if not policy.allows_port(port):
            raise Refused(403, f"port {port} is not allowed for this sandbox")
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            if isinstance(literal, ipaddress.IPv4Address) and policy.allows_address(
                literal, listed_only=True
            ):
                return literal
            raise Refused(403, f"{host} is not allowed for this sandbox")
        name = host.lower().rstrip(".")
        if not policy.allows_name(name):
            raise Refused(403, f"{name} is not in this sandbox's allowlist")
        for address in await self.resolver.resolve(name):
            if policy.allows_address(address, listed_only=False):
                return address
        raise Refused(502, f"{name} has no address this sandbox may reach")

    # -- HTTP proxy ------------------------------------------------------------

    async def _serve_http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = self._clients.get(ipaddress.IPv4Address(peer[0])) if peer else None
        task = asyncio.current_task()
        if client is None or task is None:
            writer.close()
            return
        client.tasks.add(task)  # type: ignore[arg-type]
        try:
            await self._handle(client.policy, reader, writer)
        except Refused as refused:
            await _refuse(writer, refused)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            client.tasks.discard(task)  # type: ignore[arg-type]
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(
        self, policy: NetworkPolicySpec, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        if len(head) > MAX_HEAD_BYTES:
            raise Refused(431, "request head too large")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise Refused(400, "malformed request line")
        method, target, version = parts
        headers = [line.split(":", 1) for line in lines[1:] if ":" in line]
        host_header = next((v.strip() for k, v in headers if k.strip().lower() == "host"), None)
        if method == "CONNECT":
            host, port = _split_authority(target, default_port=None)
            if host_header is not None and not _same_authority(host_header, host, port):
                raise Refused(403, "Host header does not match the CONNECT target")
            address = await self.destination(policy, host, port)
            upstream_r, upstream_w = await _open(address, port)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()

            def same_server_name(first: bytes) -> bool:
                sni = tls_sni(first)
                if sni is None or sni.lower().rstrip(".") == host.lower().rstrip("."):
                    return True
                log.warning("forged SNI refused", target=host, sni=sni[:100])
                return False

            await _relay(reader, writer, upstream_r, upstream_w, same_server_name)
            return
        if not target.lower().startswith("http://"):
            raise Refused(400, "only CONNECT and absolute http:// requests are proxied")
        authority, _, path = target[len("http://") :].partition("/")
        host, port = _split_authority(authority, default_port=80)
        if host_header is None or not _same_authority(host_header, host, port):
            raise Refused(403, "Host header does not match the request's URL")
        address = await self.destination(policy, host, port)
        upstream_r, upstream_w = await _open(address, port)
        kept = [
            f"{k}:{v}"
            for k, v in headers
            if k.strip().lower() not in ("connection", "proxy-connection", "proxy-authorization")
        ]
        upstream_w.write(
            (
                "\r\n".join([f"{method} /{path} {version}", *kept, "Connection: close"])
                + "\r\n\r\n"
            ).encode("latin-1")
        )
        await _relay(reader, writer, upstream_r, upstream_w)


def _split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    host, sep, port_text = authority.rpartition(":")
    if not sep or "]" in port_text:
        host, port_text = authority, ""
    if not port_text:
        if default_port is None:
            raise Refused(400, "CONNECT needs host:port")
        return authority, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536 or not host:
        raise Refused(400, f"bad authority {authority[:100]!r}")
    return host, int(port_text)


def _same_authority(header: str, host: str, port: int) -> bool:
    try:
        h_host, h_port = _split_authority(header, default_port=port)
    except Refused:
        return False
    return h_host.lower().rstrip(".") == host.lower().rstrip(".") and h_port == port


async def _open(
    address: ipaddress.IPv4Address, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.wait_for(asyncio.open_connection(str(address), port), CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as err:
        raise Refused(502, f"cannot connect to {address}:{port}: {err}") from None


async def _refuse(writer: asyncio.StreamWriter, refused: Refused) -> None:
    body = f"orchard egress proxy: {refused.why}\n".encode()
    reason = {400: "Bad Request", 403: "Forbidden", 431: "Too Large", 502: "Bad Gateway"}
    with contextlib.suppress(OSError):
        writer.write(
            f"HTTP/1.1 {refused.status} {reason.get(refused.status, 'Error')}\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    first_ok: Callable[[bytes], bool] | None = None,
) -> bool:
    """Copy until EOF; False (at once) when ``first_ok`` rejects the first chunk."""
    try:
        while data := await reader.read(RELAY_CHUNK):
            if first_ok is not None:
                if not first_ok(data):
                    return False
                first_ok = None
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass
    return True


async def _relay(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream_r: asyncio.StreamReader,
    upstream_w: asyncio.StreamWriter,
    first_ok: Callable[[bytes], bool] | None = None,
) -> None:
    """Both directions until both end; everything closes as soon as ``first_ok`` refuses."""
    down = asyncio.ensure_future(_pipe(upstream_r, client_w))
    try:
        if await _pipe(client_r, upstream_w, first_ok):
            await down
    finally:
        down.cancel()
        upstream_w.close()


def tls_sni(data: bytes) -> str | None:
    """The server name of a TLS ClientHello at the start of ``data``, if it is one and has it."""
    try:
        if len(data) < 5 or data[0] != 0x16 or data[5] != 0x01:
            return None
        pos = 5 + 4 + 2 + 32  # record header, handshake header, version, random
        pos += 1 + data[pos]  # session id
        (suites,) = struct.unpack("!H", data[pos : pos + 2])
        pos += 2 + suites
        pos += 1 + data[pos]  # compression methods
        (ext_total,) = struct.unpack("!H", data[pos : pos + 2])
        pos += 2
        end = min(len(data), pos + ext_total)
        while pos + 4 <= end:
            ext_type, ext_len = struct.unpack("!HH", data[pos : pos + 4])
            pos += 4
            if ext_type == 0:  # server_name
                name_len = struct.unpack("!H", data[pos + 3 : pos + 5])[0]
                return data[pos + 5 : pos + 5 + name_len].decode("ascii", "replace")
            pos += ext_len
    except (IndexError, struct.error):
        return None
    return None


class _DnsForwarder(asyncio.DatagramProtocol):
    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.DatagramTransport | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        policy = self.proxy.policy_of(str(addr[0]))
        if policy is None:
            return
        try:
            query = dns.parse_query(data)
        except dns.DnsError:
            return
        task = asyncio.ensure_future(self._reply(policy, query, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reply(
        self, policy: NetworkPolicySpec, query: dns.Query, addr: tuple[str | object, int]
    ) -> None:
        if not policy.allows_name(query.name):
            reply = dns.answer(query, [], rcode=dns.RCODE_NXDOMAIN)
        elif query.qtype != dns.TYPE_A:
            reply = dns.answer(query, [])
        else:
            found = await self.proxy.resolver.resolve(query.name)
            usable = [a for a in found if policy.allows_address(a, listed_only=False)]
            reply = dns.answer(query, usable, rcode=0 if usable else dns.RCODE_NXDOMAIN)
        if self.transport is not None:
            self.transport.sendto(reply, addr)
