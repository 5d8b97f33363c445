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
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from swerex.runtime.abstract import (
    BashAction,
    Command,
    CreateBashSessionRequest,
    UploadRequest,
)
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


def local_files(root: Path, file_mib: int, files: int) -> tuple[Path, Path]:
    """A ``file_mib`` MiB file and a ``files``-file tree (1 KiB each, 100 folders) under ``root``."""
    big = root / "big.bin"
    block = os.urandom(1 << 20)
    with open(big, "wb") as f:
        for _ in range(file_mib):
            f.write(block)
    tree = root / "tree"
    body = os.urandom(1024)
    for d in range(100):
        (tree / f"d{d:03d}").mkdir(parents=True)
    for i in range(files):
        (tree / f"d{i % 100:03d}" / f"f{i:06d}.txt").write_bytes(body)
    return big, tree


def _quiet_logger() -> logging.Logger:
    """SWE-ReX's own logger prints DEBUG lines on stdout, which is where our JSON goes."""
    logger = logging.getLogger("orchard.bench.swerex")
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler(sys.stderr))
    return logger


async def _files(runtime: RemoteRuntime, file_mib: int, files: int) -> dict[str, Any]:
    """SWE-ReX's upload of one file and of a tree (it zips, the server unzips), into /dev/shm.

    SWE-ReX has no binary download (``read_file`` returns text), so only the
    upload direction is measured.
    """
    local = Path(tempfile.mkdtemp(prefix="swerex-files-src-", dir="/dev/shm"))
    remote = Path(tempfile.mkdtemp(prefix="swerex-files-dst-", dir="/dev/shm"))
    try:
        big, tree = local_files(local, file_mib, files)
        t0 = time.perf_counter()
        await runtime.upload(UploadRequest(source_path=str(big), target_path=str(remote / "big")))
        file_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        await runtime.upload(UploadRequest(source_path=str(tree), target_path=str(remote / "t")))
        tree_s = time.perf_counter() - t0
        landed = sum(len(names) for _, _, names in os.walk(remote / "t"))
        assert landed == files, landed
        return {
            "upload_MBps": round(file_mib * (1 << 20) / 1e6 / file_s, 1),
            "upload_files_per_s": round(files / tree_s, 1),
            "download": "not offered (read_file returns text)",
        }
    finally:
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(remote, ignore_errors=True)


async def _measure(
    port: int, token: str, n: int, session_n: int, file_mib: int = 0, files: int = 0
) -> dict[str, Any]:
    runtime = RemoteRuntime(
        host="http://127.0.0.1", port=port, auth_token=token, logger=_quiet_logger()
    )
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
    if files > 0:
        out["files"] = await _files(runtime, file_mib, files)
    await runtime.close()
    return out


def measure_swerex(
    n: int = 1000, session_n: int = 100, file_mib: int = 0, files: int = 0
) -> dict[str, Any]:
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
        return asyncio.run(_measure(port, token, n, session_n, file_mib, files))
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
