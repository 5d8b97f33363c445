"""How soon a revoked tenant's held tokens stop working, per kind of executor (issue 12).

One real ``orchard up`` with the executor bundle. Per round and per template
(``node``: runc sandboxes served by the node executor, which reads
``revocations.json`` itself; ``own``: injected sandboxes, told by the
scheduler's notices), a fresh tenant gets ``--sandboxes`` sandboxes, each used
once through the SDK (so each holds a token); then its revocation is written
(``TenantRegistry.revoke``: what ``orchard tenant revoke`` does, without the CLI's
start-up) and one thread per sandbox runs ``true`` until it is refused. Each
sample is the seconds from the write to that sandbox's first refusal. Prints one
JSON object (p50/p90/max per template).

    flock /tmp/orchard-heavy.lock .venv/bin/python -m loadtest.bench_revocation [--sandboxes 8]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from orchard.executor.bundle import ensure_bundle
from orchard.gateway.tenants import TenantRegistry

from loadtest.peer_swerex import percentiles
from orchard import AuthenticationError, Orchard, Sandbox
from tests.stack import running_stack

TEMPLATES = """
[templates.node]
runtime_class = "runc"
memory_bytes = 268435456
min = 0
max = 64

[templates.own]
runtime_class = "injected"
memory_bytes = 268435456
min = 0
max = 64
"""
GIVE_UP_SECONDS = 30.0


def refused_after(sandboxes: list[Sandbox], revoke: Any) -> list[float]:
    """Revoke, then the seconds until each sandbox refuses its held token."""
    out: list[float] = [0.0] * len(sandboxes)
    go = threading.Event()
    started = [0.0]

    def poll(i: int, sb: Sandbox) -> None:
        go.wait()
        while time.monotonic() - started[0] < GIVE_UP_SECONDS:
            try:
                sb.exec("true", timeout=10)
            except AuthenticationError:
                out[i] = time.monotonic() - started[0]
                return
            time.sleep(0.01)
        out[i] = float("inf")

    threads = [threading.Thread(target=poll, args=(i, sb)) for i, sb in enumerate(sandboxes)]
    for thread in threads:
        thread.start()
    started[0] = time.monotonic()
    revoke()
    go.set()
    for thread in threads:
        thread.join()
    return out


def one_round(home: Path, endpoint: str, template: str, n: int, name: str) -> list[float]:
    tenants = TenantRegistry(home)
    key = tenants.create(name)
    client = Orchard(endpoint, key)
    sandboxes = [client.sandboxes.create(template=template, ttl=300) for _ in range(n)]
    for sb in sandboxes:
        assert sb.exec("true").exit_code == 0  # the SDK holds a token for each
    time.sleep(0.01)
    return refused_after(sandboxes, lambda: tenants.revoke(name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sandboxes", type=int, default=8, help="sandboxes per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    parent = Path(tempfile.mkdtemp(prefix="orchard-bench-revocation-", dir="/var/tmp"))
    parent.chmod(0o711)
    home = parent / "home"
    home.mkdir()
    (home / "templates.toml").write_text(TEMPLATES)
    samples: dict[str, list[float]] = {"node": [], "own": []}
    try:
        with running_stack(home, {"ORCHARD_EXECUTOR_BUNDLE": str(ensure_bundle())}) as stack:
            for r in range(args.rounds):
                for template in samples:
                    name = f"bench-{template}-{r}"
                    samples[template].extend(
                        one_round(stack.home, stack.endpoint, template, args.sandboxes, name)
                    )
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    result: dict[str, Any] = {"sandboxes_per_round": args.sandboxes, "rounds": args.rounds}
    for template, values in samples.items():
        result[template] = {
            "refused_after": percentiles([v * 1000 for v in values]),
            "max_ms": round(max(values) * 1000, 3),
            "never_refused": sum(1 for v in values if v == float("inf")),
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
