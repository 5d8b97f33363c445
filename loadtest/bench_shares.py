"""Fair shares of the node executor under attack: a victim tenant's p50, idle vs attacked.

Sets up a throwaway node (a temp home, three sandboxes whose orchard-init
runs as a host process, a real ``python -m orchard.executor`` with its
default shares) and measures the victim tenant's calls, sequentially, first
idle, then while the attacker tenant (two sandboxes) runs:

- ``slow_writes``: 40 WriteFile streams per attacker sandbox that stall after
  their first chunk (the attack that held all 32 file workers);
- ``output_floods``: Runs of 100 MB of output each with a 256 MiB cap, three
  at a time per attacker sandbox, again and again;
- ``session_flood``: sessions created until refused, in both sandboxes.

each attack alone, then all three at once. Printed JSON: the victim's p50
in ms idle (``exec`` = Run(true), ``write`` / ``read`` = a 64 KiB file,
``exec_user`` = Run(id) as a named user, ``session`` = SessionRun(true)),
and per phase the p50s, their ratio to idle, what the attacks got
(refusals) and the executor's peak RSS growth during the phase.

    .venv/bin/python -m loadtest.bench_shares [--n 40]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from orchard.executor.initbin import ensure_init_binary

from orchard._proto.orchard.v1 import executor_pb2 as pb
from tests.executor.harness import Client, ExecutorProcess, HostSandbox

MIB = 1 << 20
ATTACKERS = ("sb-attacker-1", "sb-attacker-2")
VICTIM = "sb-victim"
FLOOD = "head -c 100000000 /dev/zero"


class Node:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.stub = client.stub

    def md(self, sandbox_id: str) -> tuple[tuple[str, str], ...]:
        tenant = "victim" if sandbox_id == VICTIM else "attacker"
        token, _ = self.client.signer.issue(sandbox_id, 3600, tenant=tenant)
        return (("authorization", f"Bearer {token}"),)


def victim_calls(node: Node) -> dict[str, Callable[[], object]]:
    md = node.md(VICTIM)
    stub = node.stub
    session = stub.CreateSession(pb.CreateSessionRequest(sandbox_id=VICTIM), metadata=md).session_id
    body = b"v" * 65536

    def write() -> object:
        def requests() -> Iterator[pb.WriteFileRequest]:
            yield pb.WriteFileRequest(header=pb.WriteFileHeader(sandbox_id=VICTIM, path="/v.bin"))
            yield pb.WriteFileRequest(data=body)
            yield pb.WriteFileRequest(end=pb.WriteFileEnd(size=len(body)))

        return stub.WriteFile(requests(), metadata=md, timeout=60)

    def read() -> object:
        request = pb.ReadFileRequest(sandbox_id=VICTIM, path="/v.bin")
        return b"".join(c.data for c in stub.ReadFile(request, metadata=md, timeout=60))

    def run(**start: object) -> Callable[[], object]:
        request = pb.RunRequest(start=pb.ExecStart(sandbox_id=VICTIM, **start))  # type: ignore[arg-type]
        return lambda: stub.Run(request, metadata=md, timeout=60)

    session_request = pb.SessionRunRequest(sandbox_id=VICTIM, session_id=session, command="true")
    write()
    return {
        "exec": run(argv=["true"]),
        "exec_user": run(argv=["id", "-u"], user="alice"),
        "write": write,
        "read": read,
        "session": lambda: stub.SessionRun(session_request, metadata=md, timeout=60),
    }


def p50_ms(calls: dict[str, Callable[[], object]], n: int) -> dict[str, float]:
    out = {}
    for name, call in calls.items():
        call()  # warm
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            call()
            samples.append((time.perf_counter() - start) * 1000)
        out[name] = round(statistics.median(samples), 3)
    return out


class Attack:
    """The attacker tenant's three floods, running until :meth:`stop`."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.stopping = threading.Event()
        self.counts: dict[str, int] = {
            "slow_writes_refused": 0,
            "slow_writes_held": 0,
            "floods_done": 0,
            "floods_refused": 0,
            "sessions_open": 0,
            "sessions_refused": 0,
        }
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8)
        self._writes: list[grpc.Future] = []
        self._sessions: list[tuple[str, str]] = []

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def start(self, kinds: set[str]) -> None:
        for sandbox_id in ATTACKERS:
            for i in range(40 if "slow_writes" in kinds else 0):
                self._writes.append(
                    self.node.stub.WriteFile.future(
                        self._stalled(sandbox_id, i), metadata=self.node.md(sandbox_id), timeout=600
                    )
                )
            for _ in range(3 if "output_floods" in kinds else 0):
                self._pool.submit(self._flood, sandbox_id)
            while "session_flood" in kinds:
                try:
                    session = self.node.stub.CreateSession(
                        pb.CreateSessionRequest(sandbox_id=sandbox_id),
                        metadata=self.node.md(sandbox_id),
                    )
                except grpc.RpcError:
                    self._count("sessions_refused")
                    break
                self._sessions.append((sandbox_id, session.session_id))
                self._count("sessions_open")
        time.sleep(1.0)  # the streams reach the executor and take what they can

    def _stalled(self, sandbox_id: str, index: int) -> Iterator[pb.WriteFileRequest]:
        header = pb.WriteFileHeader(sandbox_id=sandbox_id, path=f"/slow-{index}")
        yield pb.WriteFileRequest(header=header)
        yield pb.WriteFileRequest(data=b"x" * 65536)
        self.stopping.wait(600)
        yield pb.WriteFileRequest(end=pb.WriteFileEnd(size=65536))  # stopped: complete

    def _flood(self, sandbox_id: str) -> None:
        request = pb.RunRequest(
            start=pb.ExecStart(sandbox_id=sandbox_id, shell=FLOOD, max_output_bytes=256 * MIB)
        )
        while not self.stopping.is_set():
            try:
                self.node.stub.Run(request, metadata=self.node.md(sandbox_id), timeout=120)
                self._count("floods_done")
            except grpc.RpcError:
                self._count("floods_refused")
                time.sleep(0.2)

    def stop(self) -> None:
        self.stopping.set()
        for future in self._writes:
            error = future.exception(timeout=120)
            self._count("slow_writes_held" if error is None else "slow_writes_refused")
        self._pool.shutdown(wait=True)
        for sandbox_id, session_id in self._sessions:
            self.node.stub.CloseSession(
                pb.SessionRef(sandbox_id=sandbox_id, session_id=session_id),
                metadata=self.node.md(sandbox_id),
            )


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=40, help="calls per victim figure")
    parser.add_argument(
        "--phases",
        default="slow_writes,output_floods,session_flood,all",
        help="comma-separated attack phases to run",
    )
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="oe-shares-", dir="/tmp"))
    init_binary = ensure_init_binary(home)
    boxes = [HostSandbox(i, home, init_binary).create() for i in (*ATTACKERS, VICTIM)]
    executor = ExecutorProcess.start(home)
    client = Client(executor.address, home)
    try:
        node = Node(client)
        calls = victim_calls(node)
        idle = p50_ms(calls, args.n)
        pid = executor.process.pid
        phases: dict[str, object] = {"idle_p50_ms": idle}
        for phase in args.phases.split(","):
            kinds = {"slow_writes", "output_floods", "session_flood"} if phase == "all" else {phase}
            with open(f"/proc/{pid}/clear_refs", "w") as clear:
                clear.write("5")
            rss_before = peak_rss(pid)
            attack = Attack(node)
            attack.start(kinds)
            try:
                attacked = p50_ms(calls, args.n)
            finally:
                attack.stop()
            phases[phase] = {
                "victim_p50_ms": attacked,
                "ratio_to_idle": {k: round(v / idle[k], 2) for k, v in attacked.items()},
                "attack": {k: v for k, v in attack.counts.items() if v},
                "executor_peak_rss_growth_mib": round((peak_rss(pid) - rss_before) / MIB, 1),
            }
        print(json.dumps(phases, indent=2))
    finally:
        client.close()
        executor.stop()
        for box in boxes:
            box.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
