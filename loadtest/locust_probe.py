"""Liveness under load: a separate client that creates a fresh sandbox and runs one command.

While Locust's users hammer the stack, this runs in the driver's process (not
Locust's), with its own tenant's key, every ``interval`` seconds: cold ``Sandbox.create`` + ``exec("echo
alive")`` + delete, timing the create + exec (the target: under 1 s). A probe
that fails records its error; the count of probes over the target is reported.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from orchard import Orchard, OrchardError

TARGET_SECONDS = 1.0


@dataclass
class LivenessProbe:
    endpoint: str
    api_key: str
    interval: float = 2.0
    latencies_ms: list[float] = field(default_factory=list)
    create_ms: list[float] = field(default_factory=list)
    """The create part of each entry of ``latencies_ms`` (the rest is the exec)."""
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="liveness-probe", daemon=True)
        self._thread.start()

    def _once(self) -> None:
        started = time.perf_counter()
        sandbox = Orchard(self.endpoint, self.api_key).sandboxes.create(network="none", timeout=60)
        created = time.perf_counter()
        try:
            result = sandbox.exec("echo alive", timeout=30)
            elapsed_ms = (time.perf_counter() - started) * 1000.0
            if result.exit_code != 0 or result.stdout_text != "alive\n":
                self.errors.append(f"exec answered {result.exit_code} {result.stdout_text!r}")
                return
            self.latencies_ms.append(elapsed_ms)
            self.create_ms.append((created - started) * 1000.0)
        finally:
            sandbox.delete()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self._once()
            except OrchardError as err:
                self.errors.append(f"{type(err).__name__}: {err}"[:300])
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        samples = sorted(self.latencies_ms)
        return {
            "what": "fresh create + exec 'echo alive' from a separate client, every "
            f"{self.interval:g} s during the load",
            "probes": len(samples) + len(self.errors),
            "failed": len(self.errors),
            "errors": self.errors[:5],
            "create_exec_ms": {
                "p50": round(statistics.median(samples), 1) if samples else None,
                "max": round(samples[-1], 1) if samples else None,
                "all": [round(s, 1) for s in self.latencies_ms],
                "create_part": [round(s, 1) for s in self.create_ms],
            },
            "over_target": sum(1 for s in samples if s > TARGET_SECONDS * 1000.0),
            "target_ms": TARGET_SECONDS * 1000.0,
        }
