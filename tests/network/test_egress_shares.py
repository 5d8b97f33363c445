"""One tenant's many sandboxes against the egress proxy's and DNS forwarder's node-wide
budgets (issue 12, class 3): what they hold is capped per sandbox, per tenant and for the
node, so another tenant is still served, and every refusal is an answer, at once.

The real ``EgressProxy`` (HTTP proxy and DNS forwarder) runs in the test's event loop on
loopback. The proxy knows a sandbox only by its source address, so "sandboxes" here are
sockets bound to their own 127.0.x.y address: what is tested is the proxy's accounting,
which is the same whatever the transport. The upstream DNS server is a small real UDP
server on loopback that answers some names at once and leaves others unanswered.
Attacks on real runc sandboxes through the bridge are in test_egress_attacks.py.
"""

from __future__ import annotations

import asyncio
import ipaddress
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from orchard.scheduler.backends.netpolicy import dns
from orchard.scheduler.backends.netpolicy.guard import NodeGuard
from orchard.scheduler.backends.netpolicy.k8s import proxy_table_entry, read_proxy_entries
from orchard.scheduler.backends.netpolicy.policy import build_policy
from orchard.scheduler.backends.netpolicy.proxy import EgressProxy
from orchard.scheduler.backends.netpolicy.settings import EgressLimits, NetworkSettings
from orchard.scheduler.backends.netpolicy.shares import Shares

INTERNET = build_policy("internet", [], [], [])
PUBLIC = ipaddress.IPv4Address("93.184.216.34")


def sandbox(tenant: int, n: int) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(f"127.0.{tenant}.{n + 1}")


class FakeUpstream(asyncio.DatagramProtocol):
    """Answers ``fast.test`` at once (PUBLIC), ``broken.test`` with SERVFAIL, nothing else."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        query = dns.parse_query(data)
        if query.name == "fast.test":
            self.transport.sendto(dns.answer(query, [PUBLIC]), addr)
        elif query.name == "broken.test":
            self.transport.sendto(dns.answer(query, [], rcode=dns.RCODE_SERVFAIL), addr)


@asynccontextmanager
async def egress(limits: EgressLimits) -> AsyncIterator[EgressProxy]:
    loop = asyncio.get_running_loop()
    upstream, _ = await loop.create_datagram_endpoint(FakeUpstream, local_addr=("127.0.0.1", 0))
    resolver = dns.Resolver(
        upstream.get_extra_info("sockname"), limits.dns_timeout_seconds, limits.dns_max_upstream
    )
    proxy = EgressProxy("127.0.0.1", resolver, NodeGuard(NetworkSettings(), subnet=False), limits)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
        upstream.close()


# ---- proxy connections --------------------------------------------------------------


async def _open(proxy: EgressProxy, source: ipaddress.IPv4Address) -> tuple[bool, str]:
    """A connection from ``source`` that sends nothing: (held, what the proxy said)."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", proxy.proxy_port, local_addr=(str(source), 0)
    )
    try:
        said = await asyncio.wait_for(reader.read(4096), 0.5)
    except TimeoutError:
        HELD.append(writer)
        return True, ""
    writer.close()
    return False, said.decode()


HELD: list[asyncio.StreamWriter] = []


def test_one_tenants_sandboxes_leave_the_node_budget_to_another_tenant() -> None:
    limits = EgressLimits(
        max_connections=4, max_connections_per_tenant=12, max_connections_node=20, head_seconds=30
    )

    async def attack() -> None:
        async with egress(limits) as proxy:
            attacker = [sandbox(1, n) for n in range(6)]
            victim = [sandbox(2, n) for n in range(2)]
            late = sandbox(3, 0)
            for address in attacker:
                proxy.set_policy(address, INTERNET, "tenant-a")
            for address in victim:
                proxy.set_policy(address, INTERNET, "tenant-b")
            proxy.set_policy(late, INTERNET, "tenant-c")
            try:
                # The attacker's six sandboxes each try 6: 4 per sandbox, 12 for the tenant.
                tries = await asyncio.gather(*(_open(proxy, a) for a in attacker for _ in range(6)))
                held = sum(ok for ok, _ in tries)
                assert held == limits.max_connections_per_tenant
                refusals = [said for ok, said in tries if not ok]
                assert all(s.startswith("HTTP/1.1 429 ") for s in refusals), refusals[:2]
                assert any("tenant has 12 open proxy connections" in s for s in refusals)
                assert any("this sandbox has 4 open proxy connections" in s for s in refusals)
                # Another tenant then gets all its sandboxes' caps: the node has room.
                got = await asyncio.gather(*(_open(proxy, v) for v in victim for _ in range(4)))
                assert all(ok for ok, _ in got), got
                # The node's budget is full: a third tenant is refused, and told so.
                ok, said = await _open(proxy, late)
                assert not ok and "this node has 20 open proxy connections" in said, said
                assert proxy.connections.held() == limits.max_connections_node
                # Let go: the accounting returns to zero (no leak on close).
                for writer in HELD:
                    writer.close()
                HELD.clear()
                deadline = time.monotonic() + 5
                # Polled: the proxy's handlers release as they see the EOF; nothing to await.
                while proxy.connections.held() and time.monotonic() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                assert proxy.connections.held() == 0
            finally:
                for writer in HELD:
                    writer.close()
                HELD.clear()

    asyncio.run(attack())


# ---- DNS ----------------------------------------------------------------------------


async def _ask(
    proxy: EgressProxy, source: ipaddress.IPv4Address, name: str, qid: int, wait: float
) -> tuple[int | None, float, list[ipaddress.IPv4Address]]:
    """One A query from ``source``: (rcode, or None for silence; seconds; addresses)."""
    loop = asyncio.get_running_loop()
    reply: asyncio.Future[bytes] = loop.create_future()

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
            if not reply.done():
                reply.set_result(data)

    transport, _ = await loop.create_datagram_endpoint(
        Client, local_addr=(str(source), 0), remote_addr=("127.0.0.1", proxy.dns_port)
    )
    started = time.monotonic()
    try:
        transport.sendto(dns.a_query(qid, name))
        data = await asyncio.wait_for(reply, wait)
    except TimeoutError:
        return None, time.monotonic() - started, []
    finally:
        transport.close()
    flags = struct.unpack("!H", data[2:4])[0]
    addresses = dns.parse_a_answer(data, qid)[0] if not flags & 0xF else []
    return flags & 0xF, time.monotonic() - started, addresses


def test_a_dns_flood_from_one_tenant_is_refused_and_another_tenant_is_answered() -> None:
    limits = EgressLimits(
        dns_max_pending=4,
        dns_max_pending_per_tenant=8,
        dns_max_pending_node=16,
        dns_max_upstream=12,
        dns_timeout_seconds=1.5,
    )

    async def attack() -> None:
        async with egress(limits) as proxy:
            attacker = [sandbox(1, n) for n in range(4)]
            for address in attacker:
                proxy.set_policy(address, INTERNET, "tenant-a")
            other = sandbox(2, 0)
            proxy.set_policy(other, INTERNET, "tenant-b")
            # 40 queries the upstream never answers, from the attacker's four sandboxes.
            flood = asyncio.gather(
                *(_ask(proxy, a, f"slow-{i}.test", i, wait=5) for i, a in enumerate(attacker * 10))
            )
            await asyncio.sleep(0.3)
            # Meanwhile another tenant's query is answered, at once.
            rcode, took, addresses = await _ask(proxy, other, "fast.test", 7, wait=5)
            assert (rcode, addresses) == (0, [PUBLIC]) and took < 0.5, (rcode, took)
            answers = await flood
            refused = [a for a in answers if a[0] == dns.RCODE_REFUSED]
            failed = [a for a in answers if a[0] == dns.RCODE_SERVFAIL]
            # Past the tenant's 8, REFUSED at once; the 8 that waited, SERVFAIL at the
            # upstream timeout; none is silent, none is a false NXDOMAIN.
            assert len(failed) == limits.dns_max_pending_per_tenant, answers
            assert len(refused) == len(answers) - len(failed), answers
            assert max(took for _, took, _ in refused) < 0.5
            assert all(took < limits.dns_timeout_seconds + 1 for _, took, _ in failed)
            # An upstream that answers SERVFAIL is passed on as SERVFAIL, not NXDOMAIN.
            rcode, _, _ = await _ask(proxy, other, "broken.test", 9, wait=5)
            assert rcode == dns.RCODE_SERVFAIL
            assert proxy.dns_pending.held() == 0

    asyncio.run(attack())


def test_shares_refuse_in_order_and_give_back() -> None:
    shares = Shares(per_sandbox=2, per_tenant=3, node=4, what="things")
    assert shares.acquire("s1", "a") is None and shares.acquire("s1", "a") is None
    assert "this sandbox has 2 things" in (shares.acquire("s1", "a") or "")
    assert shares.acquire("s2", "a") is None
    assert "tenant has 3 things" in (shares.acquire("s3", "a") or "")
    assert shares.acquire("s4", "b") is None
    assert "this node has 4 things" in (shares.acquire("s5", "c") or "")
    for s, t in (("s1", "a"), ("s1", "a"), ("s2", "a"), ("s4", "b")):
        shares.release(s, t)
    assert shares.held() == 0 and shares.held(tenant="a") == 0


def test_the_kubernetes_table_carries_each_pods_tenant() -> None:
    files = {
        "sb-a.json": proxy_table_entry("10.244.0.5", INTERNET, "team-a"),
        "sb-b.json": proxy_table_entry("10.244.0.6", INTERNET),
    }
    assert read_proxy_entries(files) == {
        ipaddress.IPv4Address("10.244.0.5"): (INTERNET, "team-a"),
        ipaddress.IPv4Address("10.244.0.6"): (INTERNET, ""),
    }
