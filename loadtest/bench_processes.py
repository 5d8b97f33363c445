"""What a background process and a terminal cost beside a plain exec, through the SDK.

Starts a throwaway ``orchard up`` (real gateway, scheduler, node executor, runc
sandbox), then in one sandbox times, in alternating rounds so drift hits each
path alike:

- ``exec``: ``sb.exec(["true"])`` (one Run call);
- ``start``: ``sb.start(["true"])`` until the handle returns (one StartProcess);
- ``start_wait``: ``sb.start(["true"]).wait()`` (StartProcess + WaitProcess);
- ``terminal_wait``: ``sb.terminal(["true"]).wait()`` (a pty allocated in the sandbox);
- ``keystroke``: one byte written to ``cat`` on a terminal until its echo comes back
  on an attached output stream (ProcessInput + the AttachProcess stream).

Prints one JSON object (p50/p90/p99 in ms per path). Bounded: ``--n`` rounds.

    flock /tmp/orchard-heavy.lock .venv/bin/python -m loadtest.bench_processes [--n 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from queue import Queue

from orchard import Orchard, OutputChunk, Process, Sandbox
from tests.stack import running_stack


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)

    return {
        "n": len(ordered),
        "p50_ms": pick(0.5),
        "p90_ms": pick(0.9),
        "p99_ms": pick(0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1e3, 3),
    }


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


class Echo:
    """``cat`` on a raw terminal (each byte read at once), its output read by a thread."""

    def __init__(self, sb: Sandbox) -> None:
        self.proc: Process = sb.terminal(["sh", "-c", "stty raw -echo; echo ready; exec cat"])
        self.chunks: Queue[bytes] = Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for(b"ready")

    def _read(self) -> None:
        for event in self.proc.output():
            if isinstance(event, OutputChunk):
                self.chunks.put(event.data)

    def wait_for(self, needle: bytes) -> None:
        seen = b""
        while needle not in seen:
            seen += self.chunks.get(timeout=10)

    def keystroke(self) -> None:
        self.proc.write(b"k")
        self.wait_for(b"k")


def run(n: int) -> dict[str, object]:
    with (
        tempfile.TemporaryDirectory(prefix="orchard-bench-procs-") as tmp,
        running_stack(Path(tmp) / "home") as stack,
    ):
        key = (stack.home / "dev-api-key").read_text().strip()
        client = Orchard(stack.endpoint, key)
        with client.sandboxes.create(memory="512Mi", ttl=600) as sb:
            echo = Echo(sb)
            paths: dict[str, Callable[[], object]] = {
                "exec": lambda: sb.exec(["true"]),
                "start": lambda: sb.start(["true"]),
                "start_wait": lambda: sb.start(["true"]).wait(timeout=30),
                "terminal_wait": lambda: sb.terminal(["true"]).wait(timeout=30),
                "keystroke": echo.keystroke,
            }
            for fn in paths.values():  # warm-up
                for _ in range(10):
                    fn()
            samples: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(n):
                for name, fn in paths.items():
                    samples[name].append(timed(fn))
            echo.proc.kill()
        client.close()
    result: dict[str, object] = {name: summary(s) for name, s in samples.items()}
    exec_p50 = summary(samples["exec"])["p50_ms"]
    result["start_over_exec_p50"] = round(summary(samples["start"])["p50_ms"] / exec_p50, 2)
    result["terminal_wait_over_start_wait_p50"] = round(
        summary(samples["terminal_wait"])["p50_ms"] / summary(samples["start_wait"])["p50_ms"], 2
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=300, help="rounds (each path once per round)")
    args = parser.parse_args()
    print(json.dumps(run(args.n), indent=2))


if __name__ == "__main__":
    main()
