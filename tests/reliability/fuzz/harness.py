"""What every hostile-client test needs: generic calls, clear-status rules, state snapshots, counts.

A *clear* answer is OK or a status that names the client's mistake
(INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED, ...) with a non-empty message.
UNKNOWN and INTERNAL (an exception escaped a servicer), UNAVAILABLE (a process
died), DEADLINE_EXCEEDED (the server hung) and a silent error are not.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor

RESULTS_DIR = Path(os.environ.get("ORCHARD_RELIABILITY_RESULTS") or "build/reliability")

CLEAR_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
REFUSALS = CLEAR_CODES - {grpc.StatusCode.UNIMPLEMENTED}


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str

    @property
    def clear(self) -> bool:
        return (
            self.code == grpc.StatusCode.OK
            or (self.code in CLEAR_CODES and bool(self.details.strip()))
            or self.idle_ended
        )

    @property
    def idle_ended(self) -> bool:
        """The executor ended a silent stream (stream_bounds.py): DEADLINE_EXCEEDED from the
        server with its message, not a client deadline that ran out."""
        return self.code == grpc.StatusCode.DEADLINE_EXCEEDED and "sent nothing" in self.details


def call_raw(
    channel: grpc.Channel,
    method: MethodDescriptor,
    payloads: Iterable[bytes],
    metadata: tuple[tuple[str, str], ...] = (),
    timeout: float = 20.0,
) -> Outcome:
    """One call of ``method`` with ``payloads`` as the request bytes (identity serializers)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    items = list(payloads)
    try:
        if method.client_streaming and method.server_streaming:
            list(channel.stream_stream(path)(iter(items), metadata=metadata, timeout=timeout))
        elif method.client_streaming:
            channel.stream_unary(path)(iter(items), metadata=metadata, timeout=timeout)
        elif method.server_streaming:
            list(channel.unary_stream(path)(items[0], metadata=metadata, timeout=timeout))
        else:
            channel.unary_unary(path)(items[0], metadata=metadata, timeout=timeout)
    except grpc.RpcError as err:
        return Outcome(getattr(err, "code")(), str(getattr(err, "details")() or ""))  # noqa: B009
    return Outcome(grpc.StatusCode.OK, "")


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


FAILED = 5  # sandbox_pb2.FAILED
# The image every hostile create names (with a random suffix): never in the store, so each
# such create can only be refused.
REFUSED_IMAGE_PREFIX = "no-such-image"
# A row is a refused create's if it is FAILED or names that image: the reaper later moves a
# FAILED row whose (possibly 1 s) TTL ran out to DELETED, so the state alone cannot tell.
_REFUSED = "(state = ? OR image LIKE ?)"
_REFUSED_ARGS = (FAILED, REFUSED_IMAGE_PREFIX + "%")  # no LIKE wildcards in the prefix


def store_rows(home: Path) -> list[tuple[Any, ...]]:
    """Every row of the scheduler's sandboxes table but refused creates', in a stable order.

    A create refused for a client's reason (an unknown image) still leaves a FAILED
    record with the reason, by design (GetSandbox tells why); no folder, process or
    quota goes with it, and the reaper marks it DELETED once its TTL runs out.
    :func:`failed_rows` counts those separately.
    """
    db = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True, timeout=10)
    try:
        rows = db.execute(f"SELECT * FROM sandboxes WHERE NOT {_REFUSED}", _REFUSED_ARGS)
        return sorted(rows.fetchall(), key=repr)
    finally:
        db.close()


def failed_rows(home: Path) -> int:
    """How many records refused creates left (FAILED, or DELETED after their TTL)."""
    db = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True, timeout=10)
    try:
        query = f"SELECT COUNT(*) FROM sandboxes WHERE {_REFUSED}"
        return int(db.execute(query, _REFUSED_ARGS).fetchone()[0])
    finally:
        db.close()


def state_snapshot(home: Path) -> tuple[list[tuple[Any, ...]], list[str]]:
    """Store rows plus the sandbox folders on disk: what a refused call must not change."""
    folders = (
        sorted(p.name for p in (home / "sandboxes").iterdir())
        if (home / "sandboxes").is_dir()
        else []
    )
    return store_rows(home), folders


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def service_pid(stack_pid: int, module: str) -> int:
    """The pid of the ``orchard up`` child running ``python -m <module>``."""
    for child in Path(f"/proc/{stack_pid}/task/{stack_pid}/children").read_text().split():
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if module.encode() in cmdline:
            return int(child)
    raise LookupError(f"no {module} under pid {stack_pid}")


def latencies(call: Callable[[], object], count: int) -> list[float]:
    out = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def p50_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


@dataclass
class Tally:
    """Calls made and their codes, per RPC; written as JSON for docs/reliability.md."""

    name: str
    codes: dict[str, Counter[str]] = field(default_factory=dict)
    unclear: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, rpc: str, outcome: Outcome, what: str = "") -> None:
        self.codes.setdefault(rpc, Counter())[outcome.code.name] += 1
        if not outcome.clear:
            self.unclear.append(
                f"{rpc} {what[:120]!r}: {outcome.code.name} {outcome.details[:200]!r}"
            )

    @property
    def calls(self) -> int:
        return sum(sum(c.values()) for c in self.codes.values())

    def write(self) -> dict[str, Any]:
        data = {
            "name": self.name,
            "rpcs": len(self.codes),
            "calls": self.calls,
            "unclear": len(self.unclear),
            "unclear_examples": self.unclear[:10],
            "codes": {rpc: dict(c) for rpc, c in sorted(self.codes.items())},
            **self.extra,
        }
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / f"{self.name}.json").write_text(json.dumps(data, indent=2) + "\n")
        print(json.dumps({k: v for k, v in data.items() if k != "codes"}))
        return data
