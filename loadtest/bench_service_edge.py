"""What the one service edge (``ServiceErrors``) costs per call, A/B on one machine.

Two grpc.aio servers on uvloop in child processes, each echoing bytes through a
unary and a unary-stream handler: one bare, one with the ``ServiceErrors``
interceptor the ``ServiceRunner`` puts on every Orchard server (the gateway's
data-plane proxy calls included). A sync client alternates rounds between
them (the order flips every round); the edge's cost is the median of the
per-round differences of the round medians, and the servers' CPU per call
from ``/proc``.

    .venv/bin/python loadtest/bench_service_edge.py [--rounds 10] [--per-round 500]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import uvloop

from orchard.common.service_edge import ServiceErrors

UNARY = "/edge.Bench/Echo"
STREAM = "/edge.Bench/Chunks"


def _identity(data: bytes) -> bytes:
    return data


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(with_edge: bool, ready: Any) -> None:
    async def echo(request: bytes, context: Any) -> bytes:
        return request

    async def chunks(request: bytes, context: Any) -> AsyncIterator[bytes]:
        for _ in range(4):
            yield request

    async def main() -> None:
        server = grpc.aio.server(interceptors=[ServiceErrors("bench")] if with_edge else [])
        handlers = {
            "Echo": grpc.unary_unary_rpc_method_handler(echo, _identity, _identity),
            "Chunks": grpc.unary_stream_rpc_method_handler(chunks, _identity, _identity),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("edge.Bench", handlers),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.put((port, os.getpid()))
        await server.wait_for_termination()

    uvloop.run(main())


def _round(channel: grpc.Channel, n: int) -> list[float]:
    echo = channel.unary_unary(UNARY)
    stream = channel.unary_stream(STREAM)
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        if i % 2:
            list(stream(b"x" * 64))
        else:
            echo(b"x" * 64)
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=500)
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    servers: dict[str, tuple[Any, int, int]] = {}
    for name, with_edge in (("bare", False), ("edge", True)):
        ready = ctx.Queue()
        process = ctx.Process(target=_serve, args=(with_edge, ready), daemon=True)
        process.start()
        port, pid = ready.get(timeout=30)
        servers[name] = (process, port, pid)
    channels = {n: grpc.insecure_channel(f"127.0.0.1:{s[1]}") for n, s in servers.items()}
    try:
        for channel in channels.values():
            _round(channel, 200)  # warm up
        medians: dict[str, list[float]] = {n: [] for n in channels}
        cpu = {n: 0.0 for n in channels}
        for i in range(args.rounds):
            order = list(channels) if i % 2 == 0 else list(reversed(channels))
            for name in order:
                pid = servers[name][2]
                before = _cpu_seconds(pid)
                medians[name].append(statistics.median(_round(channels[name], args.per_round)))
                cpu[name] += _cpu_seconds(pid) - before
        calls = args.rounds * args.per_round
        diffs = [e - b for e, b in zip(medians["edge"], medians["bare"], strict=True)]
        print(
            json.dumps(
                {
                    "calls_per_server": calls,
                    "mix": "half unary, half unary-stream of 4 messages",
                    "p50_ms": {n: round(statistics.median(m), 4) for n, m in medians.items()},
                    "edge_overhead_p50_ms": round(statistics.median(diffs), 4),
                    "server_cpu_us_per_call": {
                        n: round(c / calls * 1e6, 1) for n, c in cpu.items()
                    },
                },
                indent=2,
            )
        )
    finally:
        for channel in channels.values():
            channel.close()
        for process, _, _ in servers.values():
            process.terminate()
            process.join(5)


if __name__ == "__main__":
    main()
