"""The real rewards service (``python -m orchard.rewards``) for the recipe's tests, judging with
a scripted OpenAI-compatible model, behind a stand-in for the gateway's key check.

The rewards service asks the gateway whether a caller's API key is good (``ListImages`` with
that key), the model proxy whose tenant it is (``GetTenant``); a whole gateway needs a running stack (runc, the heavy lock), so the stand-in
answers those two RPCs from a key table over the same proto and a real socket. Everything else
(the service, its judge client, the SDK's ``AsyncRewards``, the model server) is the real
thing over real sockets; only the model's answers are scripted.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from orchard._proto.orchard.v1 import sandbox_pb2, sandbox_pb2_grpc

API_KEY = "key-trainer"


class _Keys(sandbox_pb2_grpc.SandboxServiceServicer):
    """``ListImages`` (the rewards service's key check) and ``GetTenant`` (the model proxy's)."""

    def __init__(self, keys: set[str]) -> None:
        self.keys = keys

    def _check(self, context: grpc.ServicerContext) -> str:
        header = str(dict(context.invocation_metadata()).get("authorization", ""))
        key = header.removeprefix("Bearer ")
        if key not in self.keys:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid API key")
        return key

    def ListImages(
        self, request: Any, context: grpc.ServicerContext
    ) -> sandbox_pb2.ListImagesResponse:
        self._check(context)
        return sandbox_pb2.ListImagesResponse()

    def GetTenant(self, request: Any, context: grpc.ServicerContext) -> sandbox_pb2.TenantView:
        self._check(context)
        return sandbox_pb2.TenantView(tenant="trainer")


@contextmanager
def key_gateway(keys: set[str]) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(_Keys(keys), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@contextmanager
def rewards_service(home: Path, judge_base_url: str, model: str = "teacher") -> Iterator[str]:
    """``host:port`` of a rewards service whose judge is the model at ``judge_base_url``."""
    with key_gateway({API_KEY}) as gateway:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "ORCHARD_JUDGE_BASE_URL": judge_base_url,
               "ORCHARD_JUDGE_MODEL": model, "ORCHARD_HOME": str(home)}  # fmt: skip
        (home / "run").mkdir(parents=True, exist_ok=True)
        log = home / "rewards.log"
        with log.open("ab") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "orchard.rewards", "--home", str(home), "--listen",
                 "127.0.0.1:0", "--gateway", gateway],
                stdout=subprocess.PIPE, stderr=err, env=env,
            )  # fmt: skip
        assert process.stdout is not None
        try:
            ready, _, _ = select.select([process.stdout], [], [], 60)
            line = process.stdout.readline().decode().strip() if ready else ""
            if not line:
                raise AssertionError(
                    f"the rewards service did not start: {log.read_text()[-3000:]}"
                )
            yield line.removeprefix("grpc://")
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()


@contextmanager
def judged_rewards(home: Path, policy: Any) -> Iterator[tuple[Any, Any]]:
    """The SDK's ``AsyncRewards`` on a rewards service judging with ``policy`` (a scripted
    model's policy callable), and the scripted model (its ``requests``)."""
    import pytest

    from orchard import AsyncRewards
    from orchard.testing.scripted_model import scripted_upstream

    with (
        scripted_upstream(policy) as (upstream, url),
        rewards_service(home, url) as address,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setenv("ORCHARD_HOME", str(home))  # no stack's gateway.addr: the rewards address alone
        mp.delenv("ORCHARD_ENDPOINT", raising=False)
        yield AsyncRewards(address, API_KEY), upstream
