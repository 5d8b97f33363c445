"""A/B: a neighbour's exec latency while one client streams 1-byte WriteFile chunks.

Each round starts a real ``orchard up`` (temporary home) with the executor's
small-message pacing off (``ORCHARD_SMALL_MESSAGES_PER_SECOND=0`` and no cap:
the behaviour before stream_bounds.py) or on (the defaults: 1000/s
per stream after its first 64), samples another sandbox's ``exec true``
for a baseline, then again while the attack streams for ATTACK_SECONDS.
Rounds alternate off/on so drift on the shared box hits both. Prints one JSON
object (per-round p50s and the median ratio during/baseline per mode).

Run it alone, under the machine-wide lock:
    flock /tmp/orchard-heavy.lock .venv/bin/python -m tests.reliability.fuzz.bench_tiny_chunks
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from orchard import Orchard
from orchard._proto.orchard.v1 import executor_pb2, sandbox_pb2, sandbox_pb2_grpc
from tests.stack import running_stack

from .harness import bearer, latencies, p50_ms

ATTACK_SECONDS = 12.0
MAX_CHUNKS = 150_000
MODES = {
    "unpaced": {
        "ORCHARD_SMALL_MESSAGES_PER_SECOND": "0",
        "ORCHARD_MAX_SMALL_MESSAGES": "1000000000",
    },
    "paced": {"ORCHARD_SMALL_MESSAGES_PER_SECOND": "1000", "ORCHARD_MAX_SMALL_MESSAGES": "16384"},
}


def _round(mode: str) -> dict[str, Any]:
    saved = {k: os.environ.get(k) for k in MODES[mode]}
    os.environ.update(MODES[mode])
    try:
        with (
            tempfile.TemporaryDirectory(prefix="tiny-chunks-") as tmp,
            running_stack(Path(tmp) / "home") as stack,
        ):
            return _attack(stack.endpoint, (stack.home / "dev-api-key").read_text().strip())
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _attack(endpoint: str, key: str) -> dict[str, Any]:
    with (
        Orchard(endpoint, key).sandboxes.create(ttl=300) as victim,
        Orchard(endpoint, key).sandboxes.create(ttl=300) as neighbour,
    ):
        with grpc.insecure_channel(endpoint) as gateway:
            access = sandbox_pb2_grpc.SandboxServiceStub(gateway).GetExecutorAccess(
                sandbox_pb2.GetSandboxRequest(id=victim.id), metadata=bearer(key), timeout=30
            )
        probe = lambda: neighbour.exec(["true"])  # noqa: E731
        latencies(probe, 5)  # warm
        baseline = latencies(probe, 30)
        attacker = start_attacker(access.address, access.token, victim.id, ATTACK_SECONDS)
        start = time.monotonic()
        time.sleep(0.2)
        during: list[float] = []
        while attacker.poll() is None and len(during) < 400:
            during += latencies(probe, 1)
            time.sleep(0.02)
        out, _ = attacker.communicate(timeout=150)
        elapsed = time.monotonic() - start
        report = json.loads(out)
        sent, box = report["sent"], {"code": report["code"]}
        return {
            "chunks_sent": sent,
            "chunks_per_second": round(sent / elapsed),
            "outcome": box.get("code"),
            "neighbour_p50_ms_baseline": p50_ms(baseline),
            "neighbour_p50_ms_during": p50_ms(during),
            "ratio": round(p50_ms(during) / p50_ms(baseline), 2),
            "samples_during": len(during),
        }


def start_attacker(
    address: str, token: str, sandbox_id: str, seconds: float
) -> subprocess.Popen[str]:
    """The attack in its own process, as a real client is (in the measuring process it would
    share the GIL with the probe and slow the probe itself). It prints {"sent", "code"}."""
    return subprocess.Popen(
        [sys.executable, "-m", __spec__.name, "--attack", address, token, sandbox_id, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )


def attack(address: str, token: str, sandbox_id: str, seconds: float) -> dict[str, Any]:
    """One WriteFile stream of 1-byte chunks for ``seconds`` (at most MAX_CHUNKS)."""
    header = executor_pb2.WriteFileRequest(
        header=executor_pb2.WriteFileHeader(sandbox_id=sandbox_id, path="/tmp/tiny")
    ).SerializeToString()
    chunk = executor_pb2.WriteFileRequest(data=b"x").SerializeToString()
    sent = 0
    stop_at = time.monotonic() + seconds

    def stream() -> Iterator[bytes]:
        nonlocal sent
        yield header
        while sent < MAX_CHUNKS and time.monotonic() < stop_at:
            sent += 1
            yield chunk

    with grpc.insecure_channel(address) as channel:
        try:
            channel.stream_unary("/orchard.v1.ExecutorService/WriteFile")(
                stream(), metadata=bearer(token), timeout=seconds + 60
            )
            return {"sent": sent, "code": "OK", "details": ""}
        except grpc.RpcError as err:
            return {"sent": sent, "code": err.code().name, "details": err.details()}  # type: ignore[attr-defined]


def main() -> int:
    if sys.argv[1:2] == ["--attack"]:
        address, token, sandbox_id, seconds = sys.argv[2:6]
        print(json.dumps(attack(address, token, sandbox_id, float(seconds))))
        return 0
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    load_before = os.getloadavg()[0]
    for _ in range(rounds):
        for mode in MODES:
            results[mode].append(_round(mode))
            print(json.dumps({"mode": mode, **results[mode][-1]}), file=sys.stderr)
    summary = {
        mode: {
            "median_ratio": statistics.median(r["ratio"] for r in runs),
            "median_p50_ms_baseline": statistics.median(
                r["neighbour_p50_ms_baseline"] for r in runs
            ),
            "median_p50_ms_during": statistics.median(r["neighbour_p50_ms_during"] for r in runs),
            "median_chunks_per_second": statistics.median(r["chunks_per_second"] for r in runs),
        }
        for mode, runs in results.items()
    }
    print(
        json.dumps(
            {
                "summary": summary,
                "rounds": results,
                "load1_before": round(load_before, 1),
                "load1_after": round(os.getloadavg()[0], 1),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
