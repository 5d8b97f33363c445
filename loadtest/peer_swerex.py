"""SWE-ReX as a benchmark peer: `swerex-remote` on loopback, measured from its own client.

SWE-ReX (PyPI `swe-rex`) is the runtime SWE-agent uses. Its server is a FastAPI
app; its `RemoteRuntime` client posts JSON over HTTP. We measure the same two
paths as targets.md: `execute` of `true` (a fresh process per call) and a
command in a bash session (`run_in_session`). The server runs on the host with
no container around it, which favours it: our figures include a real sandbox.

    python loadtest/peer_swerex.py --n 1000      # prints JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from swerex.runtime.abstract import BashAction, Command, CreateBashSessionRequest
from swerex.runtime.remote import RemoteRuntime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"p50_ms": pick(0.50), "p90_ms": pick(0.90), "p99_ms": pick(0.99), "n": len(ordered)}


async def _timed(n: int, warmup: int, call: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    for _ in range(warmup):
        await call()
    samples: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - t0) * 1000)
    return percentiles(samples)


async def _measure(port: int, token: str, n: int, session_n: int) -> dict[str, Any]:
    runtime = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token)
    deadline = time.monotonic() + 30
    while not await runtime.is_alive():
        if time.monotonic() > deadline:
            raise RuntimeError("swerex-remote did not come up within 30 s")
        await asyncio.sleep(0.1)

    async def execute() -> None:
        result = await runtime.execute(Command(command=["true"], shell=False))
        assert result.exit_code == 0, result

    await runtime.create_session(CreateBashSessionRequest(session="bench"))

    async def session_run() -> None:
        obs = await runtime.run_in_session(
            BashAction(session="bench", command="true", check="raise")
        )
        assert obs.exit_code == 0, obs

    out = {
        "execute": await _timed(n, 50, execute),
        "session": await _timed(session_n, 5, session_run),
    }
    await runtime.close()
    return out


def measure_swerex(n: int = 1000, session_n: int = 100) -> dict[str, Any]:
    """Start swerex-remote on a free loopback port, measure, stop it."""
    exe = shutil.which("swerex-remote", path=os.path.dirname(sys.executable)) or shutil.which(
        "swerex-remote"
    )
    if exe is None:
        return {"skipped": "swerex-remote is not installed (pip install swe-rex)"}
    port, token = _free_port(), secrets.token_hex(16)
    proc = subprocess.Popen(
        [exe, "--host", "127.0.0.1", "--port", str(port), "--auth-token", token],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return asyncio.run(_measure(port, token, n, session_n))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--session-n", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps({"swerex": measure_swerex(args.n, args.session_n)}, indent=2))


if __name__ == "__main__":
    main()
