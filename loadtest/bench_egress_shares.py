"""The egress proxy and DNS forwarder under one tenant's flood: the victim tenant's p50.

The real ``EgressProxy`` with its default caps (``EgressLimits()``) in this process on
loopback; sandboxes are sockets bound to their own 127.0.x.y address (the proxy knows a
sandbox by its source address only). A small UDP server stands for the upstream DNS:
it answers ``v-*.test`` at once and leaves every other name unanswered.

The victim (one sandbox of tenant B) measures, sequentially, first idle, then while
tenant A's 16 sandboxes (another process, so its own CPU is not the proxy's loop) hold as
many idle proxy connections as they are given and keep flooding queries the upstream
never answers:

- ``proxy``: connect, send a request the proxy refuses (``GET http://127.0.0.1/``),
  read its 403: accept, head, check and answer;
- ``dns``: an A query for a fresh ``v-<n>.test`` (never cached: a real upstream trip).

Printed JSON: the p50s in ms and their ratio to idle, what the attacker holds and how
many of its tries were refused, and how many of the victim's calls failed (must be 0).

    .venv/bin/python -m loadtest.bench_egress_shares [--n 200]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import multiprocessing
import statistics
import time
from collections.abc import Awaitable, Callable
from multiprocessing.synchronize import Event as EventType

from orchard.scheduler.backends.netpolicy import dns
from orchard.scheduler.backends.netpolicy.guard import NodeGuard
from orchard.scheduler.backends.netpolicy.policy import build_policy
from orchard.scheduler.backends.netpolicy.proxy import EgressProxy
from orchard.scheduler.backends.netpolicy.settings import EgressLimits, NetworkSettings

INTERNET = build_policy("internet", [], [], [])
ATTACKERS = [ipaddress.IPv4Address(f"127.0.1.{i + 1}") for i in range(16)]
VICTIM = ipaddress.IPv4Address("127.0.2.1")


class Upstream(asyncio.DatagramProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        query = dns.parse_query(data)
        if query.name.startswith("v-"):
            self.transport.sendto(dns.answer(query, [ipaddress.IPv4Address("93.184.216.34")]), addr)


class Dns(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.replies: dict[int, asyncio.Future[bytes]] = {}

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        waiter = self.replies.pop(int.from_bytes(data[:2], "big"), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(data)


async def proxy_call(proxy: EgressProxy) -> bool:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", proxy.proxy_port, local_addr=(str(VICTIM), 0)
    )
    try:
        writer.write(b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(4096), 5)
        return answer.startswith(b"HTTP/1.1 403 ")
    finally:
        writer.close()


async def p50(call: Callable[[], Awaitable[bool]], n: int) -> tuple[float, int]:
    times, failed = [], 0
    for _ in range(n):
        started = time.perf_counter()
        failed += not await call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), failed


def attack(
    proxy_port: int,
    dns_port: int,
    limits: EgressLimits,
    ready: EventType,
    stop: EventType,
    report: multiprocessing.Queue[dict[str, int]],
) -> None:
    """Tenant A, in its own process: every sandbox tries its connection cap and more and
    holds what it is given, then all of them flood queries the upstream never answers."""

    async def run() -> dict[str, int]:
        loop = asyncio.get_running_loop()
        held: list[asyncio.StreamWriter] = []
        refused = sent = 0
        for address in ATTACKERS:
            for _ in range(limits.max_connections + 16):
                r, w = await asyncio.open_connection(
                    "127.0.0.1", proxy_port, local_addr=(str(address), 0)
                )
                try:
                    await asyncio.wait_for(r.read(1), 0.01)
                    refused += 1
                    w.close()
                except TimeoutError:
                    held.append(w)
        transports = [
            (await loop.create_datagram_endpoint(
                asyncio.DatagramProtocol, local_addr=(str(a), 0),
                remote_addr=("127.0.0.1", dns_port)))[0]
            for a in ATTACKERS
        ]  # fmt: skip
        ready.set()
        while not stop.is_set():
            for i, transport in enumerate(transports):
                transport.sendto(dns.a_query(sent & 0xFFFF, f"slow-{i}-{sent}.test"))
                sent += 1
            await asyncio.sleep(0.001)
        for w in held:
            w.close()
        return {"attacker_connections_refused": refused, "attacker_dns_sent": sent}

    report.put(asyncio.run(run()))


async def main(n: int) -> dict[str, object]:
    limits = EgressLimits(head_seconds=600)
    loop = asyncio.get_running_loop()
    upstream, _ = await loop.create_datagram_endpoint(Upstream, local_addr=("127.0.0.1", 0))
    resolver = dns.Resolver(
        upstream.get_extra_info("sockname"), limits.dns_timeout_seconds, limits.dns_max_upstream
    )
    proxy = EgressProxy("127.0.0.1", resolver, NodeGuard(NetworkSettings(), subnet=False), limits)
    await proxy.start()
    for address in ATTACKERS:
        proxy.set_policy(address, INTERNET, "tenant-a")
    proxy.set_policy(VICTIM, INTERNET, "tenant-b")
    victim_dns, _ = await loop.create_datagram_endpoint(
        Dns, local_addr=(str(VICTIM), 0), remote_addr=("127.0.0.1", proxy.dns_port)
    )
    counter = iter(range(1, 1 << 30))

    async def dns_call() -> bool:
        qid = next(counter) & 0xFFFF
        waiter = loop.create_future()
        victim_dns.get_protocol().replies[qid] = waiter  # type: ignore[attr-defined]
        victim_dns.sendto(dns.a_query(qid, f"v-{qid}-{time.monotonic_ns()}.test"))
        try:
            reply = await asyncio.wait_for(waiter, 5)
        except TimeoutError:
            return False
        return reply[3] & 0xF == 0

    result: dict[str, object] = {"caps": {
        "connections": [limits.max_connections, limits.max_connections_per_tenant,
                        limits.max_connections_node],
        "dns_pending": [limits.dns_max_pending, limits.dns_max_pending_per_tenant,
                        limits.dns_max_pending_node],
    }}  # fmt: skip
    idle = {"proxy": await p50(lambda: proxy_call(proxy), n), "dns": await p50(dns_call, n)}
    ready, stop, report = multiprocessing.Event(), multiprocessing.Event(), multiprocessing.Queue()
    attacker = multiprocessing.Process(
        target=attack, args=(proxy.proxy_port, proxy.dns_port, limits, ready, stop, report)
    )
    attacker.start()
    await loop.run_in_executor(None, ready.wait)
    await asyncio.sleep(0.5)
    attacked = {"proxy": await p50(lambda: proxy_call(proxy), n), "dns": await p50(dns_call, n)}
    result["attack"] = {
        "attacker_connections_held": proxy.connections.held(tenant="tenant-a"),
        "attacker_dns_waiting": proxy.dns_pending.held(tenant="tenant-a"),
    }
    stop.set()
    result["attack"].update(await loop.run_in_executor(None, report.get))  # type: ignore[attr-defined]
    attacker.join()
    while proxy.connections.held():  # noqa: ASYNC110  (the proxy sees the attacker's EOFs)
        await asyncio.sleep(0.05)
    result["victim_p50_ms"] = {
        k: {
            "idle": round(idle[k][0], 3),
            "attacked": round(attacked[k][0], 3),
            "ratio": round(attacked[k][0] / idle[k][0], 2),
            "failed": idle[k][1] + attacked[k][1],
        }
        for k in idle
    }
    victim_dns.close()
    await proxy.close()
    upstream.close()
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    print(json.dumps(asyncio.run(main(parser.parse_args().n)), indent=1))
