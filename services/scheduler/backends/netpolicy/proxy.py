"""The egress proxy: an HTTP proxy (CONNECT and absolute-form requests) and a
DNS forwarder, both judging each request by the sandbox it comes from.

The sandbox is known by its source address on the bridge (spoofing is dropped
at layer 2, see ``nftables``). The proxy never trusts what the client says
the destination *is*: it takes the name from the request line, checks it
against the sandbox's policy, resolves it **itself** and connects to an
address that ``NodeGuard`` and the policy both allow, checked after
resolution (no node address, sandbox or control plane behind an allowed name
or an odd spelling: ``destinations``). A ``Host`` header that names another
host than the request line is refused. Every request on a kept-alive
connection is read, checked and forwarded on its own (``http_requests``), on
its own upstream connection. A CONNECT tunnel must start with a TLS
ClientHello, reassembled however fragmented (``tls_hello``), whose SNI names
the CONNECT target; otherwise it closes before a byte reaches the server.

Open connections and DNS queries waiting are each one node-wide budget split per
sandbox, per tenant and for the node (``shares.Shares``, caps in
``EgressLimits``): past a cap the connection is answered 429 and the query
REFUSED, naming the cap, at once. Idle tunnels and connections are closed after
``idle_seconds``, heads and ClientHellos bounded in size and time; upstream DNS
sockets are bounded node-wide (``dns.Resolver``), and a query the upstream does
not answer in ``dns_timeout_seconds`` is answered SERVFAIL. The DNS forwarder
answers allowed names only (NXDOMAIN otherwise) with the addresses the proxy
itself would use; IPv4 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import resource
from dataclasses import dataclass, field
from typing import cast

import structlog

from orchard.common.log_throttle import LogThrottle

from . import dns
from .destinations import Destinations, Refused, same_authority, split_authority
from .guard import NodeGuard
from .http_requests import RequestHead, body_length, copy_body, forwarded_head, parse_head
from .policy import NetworkPolicySpec
from .relay import Activity, pipe, relay
from .settings import EgressLimits
from .shares import Shares
from .tls_hello import HelloError, read_client_hello

log = structlog.get_logger("orchard.netpolicy.proxy")

FD_HEADROOM = 512
"""fds the rest of the process (scheduler, gRPC, files) keeps beside the proxy's caps."""
MAX_RESPONSE_HEAD_BYTES = 64 * 1024
_REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
}

__all__ = ["EgressProxy", "Refused"]


@dataclass
class _Client:
    address: ipaddress.IPv4Address
    policy: NetworkPolicySpec
    tenant: str
    """The tenant's key in the shares ("" from the caller: the sandbox is its own tenant)."""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class EgressProxy:
    """One per backend process; ``set_policy``/``forget`` as sandboxes come and go."""

    def __init__(
        self,
        bind: str,
        resolver: dns.Resolver,
        guard: NodeGuard,
        limits: EgressLimits,
        proxy_port: int = 0,
        dns_port: int = 0,
    ) -> None:
        self.bind = bind
        self.resolver = resolver
        self.limits = limits
        self.destinations = Destinations(guard, resolver)
        self._clients: dict[ipaddress.IPv4Address, _Client] = {}
        self.connections = Shares(
            limits.max_connections,
            limits.max_connections_per_tenant,
            limits.max_connections_node,
            "open proxy connections",
        )
        self.dns_pending = Shares(
            limits.dns_max_pending,
            limits.dns_max_pending_per_tenant,
            limits.dns_max_pending_node,
            "DNS queries waiting",
        )
        self._server: asyncio.Server | None = None
        self._dns: asyncio.DatagramTransport | None = None
        # 0 = a free port (the local runtime); fixed ports behind a Kubernetes Service.
        self.proxy_port = proxy_port
        self.dns_port = dns_port

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        needed = 2 * self.limits.max_connections_node + self.limits.dns_max_upstream
        if soft < needed + FD_HEADROOM:
            # The node cap would not be reached before EMFILE hits the whole process.
            log.warning(
                "the fd limit is below what the egress proxy's node caps allow",
                nofile=soft,
                needed=needed + FD_HEADROOM,
            )
        self._server = await asyncio.start_server(
            self._serve_http, self.bind, self.proxy_port, limit=self.limits.max_head_bytes
        )
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

    def set_policy(
        self, address: ipaddress.IPv4Address, policy: NetworkPolicySpec, tenant: str = ""
    ) -> None:
        """Install ``policy`` for ``address``, a sandbox of ``tenant`` (a key shared by the
        tenant's sandboxes; "" = unknown, the sandbox counts as its own tenant); tunnels
        opened under the old policy are closed."""
        old = self._clients.get(address)
        self._clients[address] = _Client(address, policy, tenant or f"sandbox:{address}")
        if old is not None:
            for task in old.tasks:
                task.cancel()

    def forget(self, address: ipaddress.IPv4Address) -> None:
        old = self._clients.pop(address, None)
        if old is not None:
            for task in old.tasks:
                task.cancel()

    def client_of(self, host: str) -> _Client | None:
        with contextlib.suppress(ValueError):
            return self._clients.get(ipaddress.IPv4Address(host))
        return None

    def policy_of(self, host: str) -> NetworkPolicySpec | None:
        client = self.client_of(host)
        return None if client is None else client.policy

    @property
    def clients(self) -> int:
        return len(self._clients)

    async def destination(
        self, policy: NetworkPolicySpec, host: str, port: int
    ) -> ipaddress.IPv4Address:
        """The address to connect to for ``host:port``, or :class:`Refused`."""
        return await self.destinations.resolve(policy, host, port)

    # -- HTTP proxy ------------------------------------------------------------

    async def _serve_http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = self.client_of(peer[0]) if peer else None
        task = asyncio.current_task()
        if client is None or task is None:
            writer.close()
            return
        refusal = self.connections.acquire(client.address, client.tenant)
        if refusal is not None:
            _sandbox_line(writer, "proxy connection cap reached", why=refusal)
            await _refuse(writer, Refused(429, f"{refusal}; close some and retry"))
            writer.close()
            return
        client.tasks.add(task)  # type: ignore[arg-type]
        try:
            await self._serve_requests(client, reader, writer)
        except Refused as refused:
            await _refuse(writer, refused)
        except asyncio.LimitOverrunError:
            await _refuse(writer, Refused(431, "request head too large"))
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            pass
        finally:
            client.tasks.discard(task)  # type: ignore[arg-type]
            self.connections.release(client.address, client.tenant)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_requests(
        self, client: _Client, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Each request on the connection in turn, each checked on its own."""
        wait = self.limits.head_seconds
        while True:
            try:
                first = await asyncio.wait_for(reader.readexactly(1), wait)
            except asyncio.IncompleteReadError:
                return  # the client closed between requests
            head = first + await asyncio.wait_for(
                reader.readuntil(b"\r\n\r\n"), self.limits.head_seconds
            )
            if len(head) > self.limits.max_head_bytes:
                raise Refused(431, "request head too large")
            request = parse_head(head)
            if request.method == "CONNECT":
                await self._tunnel(client.policy, request, reader, writer)
                return
            if not await self._forward(client.policy, request, reader, writer):
                return
            if request.wants_close:
                return
            wait = self.limits.idle_seconds

    async def _tunnel(
        self,
        policy: NetworkPolicySpec,
        request: RequestHead,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        host, port = split_authority(request.target, default_port=None)
        host_header = request.host
        if host_header is not None and not same_authority(host_header, host, port):
            raise Refused(403, "Host header does not match the CONNECT target")
        address = await self.destination(policy, host, port)
        upstream_r, upstream_w = await _open(address, port, self.limits.connect_seconds)
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            try:
                hello, sni = await read_client_hello(
                    reader, self.limits.max_hello_bytes, self.limits.hello_seconds
                )
            except HelloError as err:
                _sandbox_line(writer, "tunnel refused", target=host, why=str(err))
                return
            if sni is not None and sni.lower().rstrip(".") != host.lower().rstrip("."):
                _sandbox_line(writer, "forged SNI refused", target=host, sni=sni[:100])
                return
            upstream_w.write(hello)
            await upstream_w.drain()
            await relay(reader, writer, upstream_r, upstream_w, self.limits.idle_seconds)
        finally:
            upstream_w.close()

    async def _forward(
        self,
        policy: NetworkPolicySpec,
        request: RequestHead,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """One absolute-form request and its response; True when the connection may go on."""
        if not request.target.lower().startswith("http://"):
            raise Refused(400, "only CONNECT and absolute http:// requests are proxied")
        authority, _, path = request.target[len("http://") :].partition("/")
        host, port = split_authority(authority, default_port=80)
        host_header = request.host
        if host_header is None or not same_authority(host_header, host, port):
            raise Refused(403, "Host header does not match the request's URL")
        body_length(request)  # an ambiguous framing is refused before anything is sent
        address = await self.destination(policy, host, port)
        idle = self.limits.idle_seconds
        upstream_r, upstream_w = await _open(address, port, self.limits.connect_seconds)
        try:
            upstream_w.write(forwarded_head(request, "/" + path))
            if any(v.lower() == "100-continue" for v in request.header("expect")):
                # Answered here (Expect is not forwarded): the body is read before the response.
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await copy_body(request, reader, upstream_w, idle)
            response = await asyncio.wait_for(upstream_r.readuntil(b"\r\n\r\n"), idle)
            writer.write(response)
            # We asked for Connection: close, so the response ends where the server closes.
            await pipe(upstream_r, writer, Activity(), idle, upward=False, write_eof=False)
            return _self_delimited(response, request.method)
        except asyncio.LimitOverrunError:
            raise Refused(502, "the response head is too large") from None
        finally:
            upstream_w.close()


def _self_delimited(response: bytes, method: str) -> bool:
    """Whether the client can find the response's end without our closing the connection."""
    lines = response.decode("latin-1").split("\r\n")
    status = lines[0].split(" ")
    if len(status) < 2 or status[0] != "HTTP/1.1":
        return False
    if method == "HEAD" or status[1] in ("204", "304"):
        return True  # (after a 1xx the final response's framing is unknown: close)
    names = {line.split(":", 1)[0].strip().lower() for line in lines[1:] if ":" in line}
    return "content-length" in names or "transfer-encoding" in names


# Lines a sandbox causes at will (every refused tunnel): a few per sandbox and cause a
# minute, each saying how many were left out, so no sandbox writes the logs at will.
SANDBOX_LINES = LogThrottle(every_seconds=60.0, burst=3)


def _sandbox_line(writer: asyncio.StreamWriter, event: str, **fields: str) -> None:
    peer = writer.get_extra_info("peername")
    sandbox = str(peer[0]) if peer else "?"
    suppressed = SANDBOX_LINES.allow((event, sandbox))
    if suppressed is not None:
        log.warning(event, sandbox=sandbox, suppressed=suppressed, **fields)


async def _open(
    address: ipaddress.IPv4Address, port: int, seconds: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.wait_for(
            asyncio.open_connection(str(address), port, limit=MAX_RESPONSE_HEAD_BYTES), seconds
        )
    except (OSError, TimeoutError) as err:
        raise Refused(502, f"cannot connect to {address}:{port}: {err}") from None


async def _refuse(writer: asyncio.StreamWriter, refused: Refused) -> None:
    body = f"orchard egress proxy: {refused.why}\n".encode()
    with contextlib.suppress(OSError):
        writer.write(
            f"HTTP/1.1 {refused.status} {_REASONS.get(refused.status, 'Error')}\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()


class _DnsForwarder(asyncio.DatagramProtocol):
    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.DatagramTransport | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        client = self.proxy.client_of(str(addr[0]))
        if client is None:
            return
        try:
            query = dns.parse_query(data)
        except dns.DnsError:
            return
        if self.proxy.dns_pending.acquire(client.address, client.tenant) is not None:
            # Told, not dropped: the stub resolver gives up at once instead of retrying.
            self._send(dns.answer(query, [], rcode=dns.RCODE_REFUSED), addr)
            return
        task = asyncio.ensure_future(self._reply(client, query, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reply(
        self, client: _Client, query: dns.Query, addr: tuple[str | object, int]
    ) -> None:
        policy = client.policy
        try:
            if not policy.allows_name(query.name):
                reply = dns.answer(query, [], rcode=dns.RCODE_NXDOMAIN)
            elif query.qtype != dns.TYPE_A:
                reply = dns.answer(query, [])
            else:
                found = await self.proxy.resolver.lookup(query.name)
                if found is None:
                    # The upstream failed or is saturated: say so, at once (not NXDOMAIN).
                    reply = dns.answer(query, [], rcode=dns.RCODE_SERVFAIL)
                else:
                    allowed = self.proxy.destinations.allowed
                    usable = [a for a in found if allowed(policy, a)]
                    reply = dns.answer(query, usable, rcode=0 if usable else dns.RCODE_NXDOMAIN)
        finally:
            self.proxy.dns_pending.release(client.address, client.tenant)
        self._send(reply, addr)

    def _send(self, reply: bytes, addr: tuple[str | object, int]) -> None:
        if self.transport is not None:
            self.transport.sendto(reply, addr)
