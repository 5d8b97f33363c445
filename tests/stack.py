"""A real Orchard stack for tests: ``orchard up`` as a subprocess (real processes, runc).

``orchard up`` runs with a temporary ORCHARD_HOME and the shared images folder
(ORCHARD_IMAGES_DIR, default /var/lib/orchard/images, where ``make image``
builds the default image).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

IMAGES_DIR = Path(os.environ.get("ORCHARD_IMAGES_DIR") or "/var/lib/orchard/images")
# The tools layers (`make tools-layer`), shared like the images.
TOOLS_DIR = Path(os.environ.get("ORCHARD_TOOLS_DIR") or "/var/lib/orchard/tools")
ORCHARD = [sys.executable, "-m", "orchard.cli"]

REQUIRES_STACK = [
    pytest.mark.runc,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("runc") is None, reason="needs root and runc"
    ),
    pytest.mark.skipif(
        not any(IMAGES_DIR.glob("*/image.json")), reason=f"no image in {IMAGES_DIR} (make image)"
    ),
]


@dataclass
class Stack:
    home: Path
    process: subprocess.Popen[bytes]
    endpoint: str
    output: str = ""
    """What ``orchard up`` printed up to (and with) its endpoint line."""

    @property
    def env(self) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if k not in ("ORCHARD_ENDPOINT", "ORCHARD_API_KEY")
        }
        return {
            **env,
            "ORCHARD_HOME": str(self.home),
            "ORCHARD_IMAGES_DIR": str(IMAGES_DIR),
            "ORCHARD_TOOLS_DIR": str(TOOLS_DIR),
        }

    def cli(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*ORCHARD, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert "Traceback" not in result.stderr, result.stderr
        if check:
            assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result


def _read_until_ready(process: subprocess.Popen[bytes], timeout: float) -> tuple[str, str]:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            data = os.read(process.stdout.fileno(), 4096)
            if not data:
                break
            buffer += data
            for line in buffer.decode().splitlines():
                if line.startswith("Orchard is up. Endpoint: "):
                    return line.rsplit(" ", 1)[1], buffer.decode()
    raise AssertionError(f"orchard up did not come up: {buffer.decode()}")


@contextmanager
def running_stack(
    home: Path, extra_env: dict[str, str] | None = None, up_args: Sequence[str] = ()
) -> Iterator[Stack]:
    """``orchard up --port 0 [up_args]`` in ``home`` (``extra_env`` added to its environment);
    stopped (SIGTERM, by its pid) on exit."""
    env = {
        **os.environ,
        "ORCHARD_HOME": str(home),
        "ORCHARD_IMAGES_DIR": str(IMAGES_DIR),
        "ORCHARD_TOOLS_DIR": str(TOOLS_DIR),
        **(extra_env or {}),
    }
    process = subprocess.Popen(
        [*ORCHARD, "up", "--port", "0", *up_args],
        env=env,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        endpoint, output = _read_until_ready(process, 60)
        yield Stack(home, process, endpoint, output)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(90)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
