"""One tenant attacks the node executor's shared pools; another tenant's calls still work.

Issue 12, class 3 ("node-wide resources one tenant can hold"), each attack
shown to work on the code before the fix: slow WriteFile streams that held
every file worker (the victim's write, read and ``exec(user=...)`` waited
behind them), output floods buffered without a total bound, and session
floods with only a node-wide cap. A real executor process serves real
orchard-init processes over real gRPC; the tenants are told apart by their
signed data-plane tokens, as on a stack. The pools are made small through
the executor's share settings so the attacks are cheap; the shares are the
same code at any size. Timings are not asserted here (loadtest/bench_shares.py
measures them): the checks are that the victim's calls complete, the
attacker's over-share calls are refused with RESOURCE_EXHAUSTED, and the
executor's peak RSS stays under a bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from orchard._proto.orchard.v1 import executor_pb2 as pb

from .harness import Client, ExecutorProcess, HostSandbox, error_reason

pytestmark = pytest.mark.timeout(240)

MIB = 1 << 20
ATTACKER_1 = "sb-share-a1"
ATTACKER_2 = "sb-share-a2"
VICTIM = "sb-share-b"
SHARE_ENV = {
    "ORCHARD_FILE_WORKERS": "8",
    "ORCHARD_FILE_WORKERS_PER_TENANT": "4",
    "ORCHARD_FILE_WORKERS_PER_SANDBOX": "2",
    "ORCHARD_FILE_WORKER_WAIT_SECONDS": "2",
    "ORCHARD_OUTPUT_MIB_PER_SANDBOX": "32",
    "ORCHARD_OUTPUT_MIB_PER_TENANT": "48",
    "ORCHARD_OUTPUT_MIB_NODE": "64",
    "ORCHARD_SESSIONS_PER_SANDBOX": "4",
    "ORCHARD_SESSIONS_PER_TENANT": "6",
}
# What the output floods may add to the executor's peak RSS: the 64 MiB node
# budget, a copy of it while a response is built, and the allocator's slack.
# Before the fix the same floods added more than 400 MiB.
RSS_GROWTH_BOUND = 224 * MIB
VICTIM_DEADLINE = 30.0


@dataclass
class Node:
    executor: ExecutorProcess
    client: Client

    def metadata(self, sandbox_id: str) -> tuple[tuple[str, str], ...]:
        tenant = "victim" if sandbox_id == VICTIM else "attacker"
        token, _ = self.client.signer.issue(sandbox_id, 3600, tenant=tenant)
        return (("authorization", f"Bearer {token}"),)

    def run(
        self, sandbox_id: str, timeout: float = VICTIM_DEADLINE, **start: object
    ) -> pb.RunResponse:
        request = pb.RunRequest(start=pb.ExecStart(sandbox_id=sandbox_id, **start))  # type: ignore[arg-type]
        response: pb.RunResponse = self.client.stub.Run(
            request, metadata=self.metadata(sandbox_id), timeout=timeout
        )
        return response

    def write(self, sandbox_id: str, path: str, data: bytes) -> pb.WriteFileResponse:
        def requests() -> Iterator[pb.WriteFileRequest]:
            yield pb.WriteFileRequest(header=pb.WriteFileHeader(sandbox_id=sandbox_id, path=path))
            yield pb.WriteFileRequest(data=data)
            yield pb.WriteFileRequest(end=pb.WriteFileEnd(size=len(data)))

        response: pb.WriteFileResponse = self.client.stub.WriteFile(
            requests(), metadata=self.metadata(sandbox_id), timeout=VICTIM_DEADLINE
        )
        return response

    def read(self, sandbox_id: str, path: str) -> bytes:
        chunks = self.client.stub.ReadFile(
            pb.ReadFileRequest(sandbox_id=sandbox_id, path=path),
            metadata=self.metadata(sandbox_id),
            timeout=VICTIM_DEADLINE,
        )
        return b"".join(chunk.data for chunk in chunks)

    def create_session(self, sandbox_id: str) -> str:
        session: pb.Session = self.client.stub.CreateSession(
            pb.CreateSessionRequest(sandbox_id=sandbox_id),
            metadata=self.metadata(sandbox_id),
            timeout=VICTIM_DEADLINE,
        )
        return session.session_id

    def session_run(self, sandbox_id: str, session_id: str, command: str) -> pb.RunResponse:
        response: pb.RunResponse = self.client.stub.SessionRun(
            pb.SessionRunRequest(sandbox_id=sandbox_id, session_id=session_id, command=command),
            metadata=self.metadata(sandbox_id),
            timeout=VICTIM_DEADLINE,
        )
        return response

    def close_session(self, sandbox_id: str, session_id: str) -> None:
        self.client.stub.CloseSession(
            pb.SessionRef(sandbox_id=sandbox_id, session_id=session_id),
            metadata=self.metadata(sandbox_id),
            timeout=VICTIM_DEADLINE,
        )


@pytest.fixture(scope="module")
def node(node_home: Path, init_binary: Path) -> Iterator[Node]:
    boxes = [
        HostSandbox(i, node_home, init_binary).create() for i in (ATTACKER_1, ATTACKER_2, VICTIM)
    ]
    executor = ExecutorProcess.start(node_home, env=SHARE_ENV)
    client = Client(executor.address, node_home)
    try:
        yield Node(executor, client)
    finally:
        client.close()
        executor.stop()
        for box in boxes:
            box.stop()


def _refused(error: BaseException | None) -> bool:
    return (
        isinstance(error, grpc.RpcError)
        and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        and error_reason(error) == "QUOTA_EXCEEDED"
    )


def test_slow_write_streams_leave_file_workers_to_other_tenants(node: Node) -> None:
    """24 WriteFile streams that stall after their first chunk, from two sandboxes
    of one tenant (the pool has 8 workers): the victim's write, read and
    ``exec(user=...)`` (a passwd lookup on a file worker) still complete."""
    release = threading.Event()

    def stalled(sandbox_id: str, index: int) -> Iterator[pb.WriteFileRequest]:
        header = pb.WriteFileHeader(sandbox_id=sandbox_id, path=f"/slow-{index}")
        yield pb.WriteFileRequest(header=header)
        yield pb.WriteFileRequest(data=b"x" * 65536)
        release.wait(120)
        yield pb.WriteFileRequest(end=pb.WriteFileEnd(size=65536))  # released: complete

    attacks = [
        node.client.stub.WriteFile.future(
            stalled(sandbox_id, i), metadata=node.metadata(sandbox_id), timeout=120
        )
        for sandbox_id in (ATTACKER_1, ATTACKER_2)
        for i in range(12)
    ]
    try:
        time.sleep(1.0)  # the streams reach the executor and take what they can
        assert node.write(VICTIM, "/victim.txt", b"mine").size == 4
        assert node.read(VICTIM, "/victim.txt") == b"mine"
        as_alice = node.run(VICTIM, argv=["id", "-u"], user="alice")
        assert as_alice.stdout == b"1000\n", as_alice
        time.sleep(3.0)  # past the executor's 2 s wait for a worker
    finally:
        release.set()
    errors = [attack.exception(timeout=60) for attack in attacks]
    # Streams past the attacker's share waited (holding no worker) and were refused.
    assert any(_refused(error) for error in errors), errors
    assert all(error is None or _refused(error) for error in errors), errors


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def _reset_peak_rss(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current RSS


def test_output_floods_are_refused_and_executor_memory_stays_bounded(node: Node) -> None:
    """Four Runs of ~100 MB output each (a 128 MiB cap asked) from one tenant, and an
    Exec stream whose client does not read: each is refused with RESOURCE_EXHAUSTED
    once its output passes the tenant's share, the executor's peak RSS stays under
    RSS_GROWTH_BOUND, and the victim's own 4 MiB of output comes back whole."""
    pid = node.executor.process.pid
    _reset_peak_rss(pid)
    before = _peak_rss(pid)
    flood = "head -c 100000000 /dev/zero"

    def attack(sandbox_id: str) -> BaseException | None:
        try:
            node.run(sandbox_id, timeout=120, shell=flood, max_output_bytes=128 * MIB)
        except grpc.RpcError as err:
            return err
        return None

    def unread_exec() -> BaseException | None:
        def requests() -> Iterator[pb.ExecRequest]:
            yield pb.ExecRequest(
                start=pb.ExecStart(sandbox_id=ATTACKER_1, shell=flood, max_output_bytes=128 * MIB)
            )
            time.sleep(30)

        events = node.client.stub.Exec(requests(), metadata=node.metadata(ATTACKER_1), timeout=120)
        time.sleep(5)  # the client does not read: the output waits in the executor
        try:
            for _ in events:
                pass
        except grpc.RpcError as err:
            return err
        return None

    with ThreadPoolExecutor(8) as pool:
        runs = [pool.submit(attack, box) for box in (ATTACKER_1, ATTACKER_2) * 2]
        stream = pool.submit(unread_exec)
        time.sleep(0.5)
        victim = node.run(VICTIM, shell="head -c 4194304 /dev/zero")
        errors = [run.result() for run in runs] + [stream.result()]
    growth = _peak_rss(pid) - before
    assert victim.stdout == b"\0" * (4 << 20) and not victim.status.truncated
    assert all(_refused(error) for error in errors), errors
    assert growth < RSS_GROWTH_BOUND, f"the executor's peak RSS grew by {growth / MIB:.0f} MiB"


def test_session_flood_is_capped_per_sandbox_and_per_tenant(node: Node) -> None:
    """Sessions had only a node-wide cap (4096): one sandbox could take them all."""
    opened: list[tuple[str, str]] = []
    try:
        for _ in range(4):
            opened.append((ATTACKER_1, node.create_session(ATTACKER_1)))
        with pytest.raises(grpc.RpcError) as over_sandbox:
            node.create_session(ATTACKER_1)
        assert _refused(over_sandbox.value), over_sandbox.value
        assert "sandbox" in over_sandbox.value.details()  # type: ignore[attr-defined]
        for _ in range(2):
            opened.append((ATTACKER_2, node.create_session(ATTACKER_2)))
        with pytest.raises(grpc.RpcError) as over_tenant:
            node.create_session(ATTACKER_2)
        assert _refused(over_tenant.value), over_tenant.value
        assert "tenant" in over_tenant.value.details()  # type: ignore[attr-defined]
        victim = node.create_session(VICTIM)
        opened.append((VICTIM, victim))
        assert node.session_run(VICTIM, victim, "echo ok").stdout == b"ok\n"
        # A closed session gives its share back.
        node.close_session(*opened.pop(0))
        opened.append((ATTACKER_1, node.create_session(ATTACKER_1)))
    finally:
        for sandbox_id, session_id in opened:
            node.close_session(sandbox_id, session_id)


FORGER = r"""
import os, sys
shell = os.getppid()  # the session's bash: this process is its command's child
argv = open(f"/proc/{shell}/cmdline", "rb").read().split(b"\0")
markers = [a for a in argv if b"orchard-end" in a]
for name in os.listdir(f"/proc/{shell}/fd"):
    if int(name) <= 2:
        continue
    try:
        fd = os.open(f"/proc/{shell}/fd/{name}", os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        continue
    try:
        os.write(fd, b"0\0")
    except OSError:
        pass
    os.close(fd)
for marker in markers:
    sys.stdout.buffer.write(marker)
    sys.stderr.buffer.write(marker)
sys.stdout.flush()
sys.stderr.flush()
"""


def test_a_child_process_cannot_forge_a_session_result(node: Node, tmp_path: Path) -> None:
    """Issue 12 ("Lower"): the session marker sat in bash's argv and the status
    channel was a pipe any same-uid process could reopen under /proc, so a process
    the command started could end the command early with exit 0."""
    forger = tmp_path / "forger.py"
    forger.write_text(FORGER)
    session = node.create_session(VICTIM)
    try:
        result = node.session_run(
            VICTIM, session, f"echo before; python3 {forger}; echo after; false"
        )
        assert result.status.exit_code == 1, result
        assert result.stdout.startswith(b"before\n") and result.stdout.endswith(b"after\n"), result
        again = node.session_run(VICTIM, session, "echo next")
        assert again.stdout == b"next\n" and again.status.exit_code == 0, again
    finally:
        node.close_session(VICTIM, session)
