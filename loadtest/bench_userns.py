"""What user namespaces cost at create: p50/p90 of a cold create, ``ORCHARD_USERNS`` 0 vs 1.

Two real ``orchard up`` stacks, one after the other, in homes under /var/tmp
(``1``: every sandbox in a namespace, the same as the default for runc sandboxes). In each: ``--creates`` sandboxes
created one at a time through the SDK (create returns READY) and deleted, after
one warm-up; then ``--rounds`` alternations so both settings see the same machine
load. ``--injected``: the sandboxes run their own executor (runtime class
``injected``, the executor bundle). Prints one JSON object.

    flock /tmp/orchard-heavy.lock .venv/bin/python -m loadtest.bench_userns [--creates 20] [--injected]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from orchard.executor.bundle import ensure_bundle

from loadtest.peer_swerex import percentiles
from orchard import Orchard
from tests.stack import running_stack

TEMPLATES = """
[templates.own]
runtime_class = "injected"
min = 0
max = 4
"""


def create_times(endpoint: str, key: str, creates: int, template: str | None = None) -> list[float]:
    client = Orchard(endpoint, key)
    client.sandboxes.create(ttl=120, template=template).delete()  # warm-up: first runc
    times = []
    for _ in range(creates):
        start = time.perf_counter()
        sandbox = client.sandboxes.create(ttl=120, template=template)
        times.append((time.perf_counter() - start) * 1000)
        sandbox.delete()
    return times


def measure(userns: str, creates: int, injected: bool = False) -> list[float]:
    parent = Path(tempfile.mkdtemp(prefix="orchard-bench-userns-", dir="/var/tmp"))
    parent.chmod(0o711)
    env = {"ORCHARD_USERNS": userns}
    if injected:
        (parent / "home").mkdir()
        (parent / "home" / "templates.toml").write_text(TEMPLATES)
        env["ORCHARD_EXECUTOR_BUNDLE"] = str(ensure_bundle())
    try:
        with running_stack(parent / "home", env) as stack:
            key = (stack.home / "dev-api-key").read_text().strip()
            return create_times(stack.endpoint, key, creates, "own" if injected else None)
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--creates", type=int, default=20, help="creates per round and setting")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--injected", action="store_true", help="runtime class injected")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {"0": [], "1": []}
    for _ in range(args.rounds):
        for setting in ("0", "1"):
            samples[setting].extend(measure(setting, args.creates, args.injected))
    result: dict[str, Any] = {
        "runtime_class": "injected" if args.injected else "runc",
        "creates_per_setting": len(samples["0"]),
        "userns_off": percentiles(samples["0"]),
        "userns_on": percentiles(samples["1"]),
    }
    result["p50_cost_ms"] = round(result["userns_on"]["p50_ms"] - result["userns_off"]["p50_ms"], 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
