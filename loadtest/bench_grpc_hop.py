"""What one Python gRPC pass-through hop costs, with nothing else in it.

A no-op upstream (grpc.aio on uvloop, echoes the bytes) is called by a sync
client directly and through two bare pass-through proxies (identity
(de)serializers, no auth, no routing): one grpc.aio on uvloop (what the
gateway's data-plane proxy is), one sync ``grpc.server`` with a thread pool.
Rounds alternate between the three; per-round medians, their median, and
each proxy's CPU per call from ``/proc``. This is the floor under the
gateway proxy's overhead: the proxy's own Python adds to it.

    .venv/bin/python loadtest/bench_grpc_hop.py [--rounds 8] [--per-round 500]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from concurrent import futures
from typing import Any

import grpc
import uvloop

METHOD = "/hop.Hop/Echo"


def _identity(data: bytes) -> bytes:
    return data


def _handlers(fn: Any) -> Any:
    return grpc.method_handlers_generic_handler(
        "hop.Hop", {"Echo": grpc.unary_unary_rpc_method_handler(fn)}
    )


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _upstream(ready: Any) -> None:
    async def main() -> None:
        server = grpc.aio.server()

        async def echo(request: bytes, context: Any) -> bytes:
            return request

        server.add_generic_rpc_handlers((_handlers(echo),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.put((port, os.getpid()))
        await server.wait_for_termination()

    uvloop.run(main())


def _aio_proxy(upstream: str, ready: Any) -> None:
    async def main() -> None:
        channel = grpc.aio.insecure_channel(upstream)
        call = channel.unary_unary(
            METHOD, request_serializer=_identity, response_deserializer=_identity
        )
        server = grpc.aio.server()

        async def forward(request: bytes, context: Any) -> bytes:
            response: bytes = await call(
                request, metadata=context.invocation_metadata(), timeout=context.time_remaining()
            )
            return response

        server.add_generic_rpc_handlers((_handlers(forward),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.put((port, os.getpid()))
        await server.wait_for_termination()

    uvloop.run(main())


def _sync_proxy(upstream: str, ready: Any) -> None:
    channel = grpc.insecure_channel(upstream)
    call = channel.unary_unary(
        METHOD, request_serializer=_identity, response_deserializer=_identity
    )
    server = grpc.server(futures.ThreadPoolExecutor(8))

    def forward(request: bytes, context: Any) -> bytes:
        response: bytes = call(request, metadata=context.invocation_metadata())
        return response

    server.add_generic_rpc_handlers((_handlers(forward),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ready.put((port, os.getpid()))
    server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=500)
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    procs = [ctx.Process(target=_upstream, args=(ready,), daemon=True)]
    procs[0].start()
    up_port, up_pid = ready.get(timeout=30)
    upstream = f"127.0.0.1:{up_port}"
    targets: dict[str, tuple[int, int]] = {"direct": (up_port, up_pid)}
    for name, fn in (("aio_proxy", _aio_proxy), ("sync_proxy", _sync_proxy)):
        proc = ctx.Process(target=fn, args=(upstream, ready), daemon=True)
        proc.start()
        procs.append(proc)
        targets[name] = ready.get(timeout=30)
    try:
        calls = {
            name: grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary(METHOD)
            for name, (port, _) in targets.items()
        }
        payload = b"x" * 64
        metadata = (("authorization", "Bearer " + "t" * 80),)
        for call in calls.values():
            for _ in range(200):
                call(payload, metadata=metadata)
        medians: dict[str, list[float]] = {name: [] for name in calls}
        cpu: dict[str, list[float]] = {name: [] for name in calls}
        for r in range(args.rounds):
            order = list(calls.items())
            if r % 2:
                order.reverse()
            for name, call in order:
                pid = targets[name][1]
                cpu0 = _cpu_seconds(pid)
                samples = []
                for _ in range(args.per_round):
                    t0 = time.perf_counter()
                    call(payload, metadata=metadata)
                    samples.append((time.perf_counter() - t0) * 1000)
                medians[name].append(statistics.median(samples))
                cpu[name].append((_cpu_seconds(pid) - cpu0) * 1000 / args.per_round)
        direct = statistics.median(medians["direct"])
        result: dict[str, Any] = {"loadavg": round(os.getloadavg()[0], 2)}
        for name in calls:
            p50 = statistics.median(medians[name])
            result[name] = {
                "p50_ms": round(p50, 3),
                "added_p50_ms": round(p50 - direct, 3),
                "server_cpu_ms_per_call": round(statistics.median(cpu[name]), 3),
            }
        print(json.dumps(result, indent=2))
    finally:
        for proc in procs:
            proc.terminate()
            proc.join(5)
    sys.exit(0)


if __name__ == "__main__":
    main()
