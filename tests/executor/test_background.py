"""Background processes and terminals through a real executor and real orchard-init.

The sandbox here is a host sandbox (orchard-init as a host process, see
harness.py), so the terminal is one of the host's devpts; the runc sandboxes
of the real stack are covered by tests/e2e/test_processes_live.py. A second
executor with small shares shows that one hostile sandbox's floods cannot
grow the executor past its output share.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from orchard._proto.orchard.v1 import executor_pb2 as pb

from .conftest import SANDBOX_ID
from .harness import Client, ExecutorProcess, HostSandbox, error_reason, wait_gone

pytestmark = pytest.mark.timeout(120)
MIB = 1 << 20


def _start(client: Client, sandbox_id: str = SANDBOX_ID, pty: pb.PtySize | None = None,
           **start: object) -> pb.ProcessInfo:  # fmt: skip
    request = pb.StartProcessRequest(start=pb.ExecStart(sandbox_id=sandbox_id, **start))  # type: ignore[arg-type]
    if pty is not None:
        request.pty.CopyFrom(pty)
    info: pb.ProcessInfo = client.stub.StartProcess(request, metadata=client.metadata(sandbox_id))
    return info


def _input(client: Client, info: pb.ProcessInfo, **kind: object) -> None:
    request = pb.ProcessInputRequest(
        sandbox_id=info.sandbox_id,
        process_id=info.process_id,
        **kind,  # type: ignore[arg-type]
    )
    client.stub.ProcessInput(request, metadata=client.metadata(info.sandbox_id))


def _wait(client: Client, info: pb.ProcessInfo, seconds: float = 20) -> pb.WaitProcessResponse:
    request = pb.WaitProcessRequest(
        sandbox_id=info.sandbox_id, process_id=info.process_id, timeout_seconds=seconds
    )
    response: pb.WaitProcessResponse = client.stub.WaitProcess(
        request, metadata=client.metadata(info.sandbox_id), timeout=seconds + 10
    )
    return response


def _attach(
    client: Client, info: pb.ProcessInfo, offset: int = 0, from_now: bool = False
) -> Iterator[pb.ProcessEvent]:
    request = pb.AttachProcessRequest(
        sandbox_id=info.sandbox_id, process_id=info.process_id, offset=offset, from_now=from_now
    )
    events: Iterator[pb.ProcessEvent] = client.stub.AttachProcess(
        request, metadata=client.metadata(info.sandbox_id), timeout=30
    )
    return events


def _read_until(events: Iterator[pb.ProcessEvent], needle: bytes) -> bytes:
    seen = b""
    for event in events:
        seen += event.stdout + event.stderr
        if needle in seen:
            return seen
    raise AssertionError(f"{needle!r} never came; got {seen[-400:]!r}")


def test_output_from_the_start_and_from_an_offset_after_it_exited(client: Client) -> None:
    info = _start(client, shell="echo one; echo two >&2; sleep 0.2; echo three")
    assert info.state == "running" and info.argv == ["/bin/sh", "-c", info.argv[2]]
    done = _wait(client, info)
    assert done.process.state == "exited" and done.process.status.exit_code == 0
    assert done.stdout == b"one\nthree\n" and done.stderr == b"two\n"
    events = list(_attach(client, info))
    assert events[-1].WhichOneof("kind") == "exit"
    text = b"".join(e.stdout for e in events)
    assert text == b"one\nthree\n"
    # Resume after the first event: nothing twice, nothing lost.
    first = events[0]
    rest = list(_attach(client, info, offset=first.offset))
    assert (first.stdout + first.stderr) + b"".join(e.stdout + e.stderr for e in rest[:-1]) == (
        b"".join(e.stdout + e.stderr for e in events[:-1])
    )


def test_stdin_signals_and_the_process_outlives_its_readers(client: Client) -> None:
    info = _start(client, shell="trap 'echo got-term; exit 7' TERM; while read l; do echo re:$l; done",
                  stdin=True)  # fmt: skip
    stream = _attach(client, info)
    _input(client, info, stdin=b"hello\n")
    assert b"re:hello" in _read_until(stream, b"re:hello")
    stream.cancel()  # type: ignore[attr-defined]
    time.sleep(0.2)
    listed = client.stub.ListProcesses(
        pb.ListProcessesRequest(sandbox_id=SANDBOX_ID), metadata=client.metadata(SANDBOX_ID)
    )
    mine = [p for p in listed.processes if p.process_id == info.process_id]
    assert mine and mine[0].state == "running"
    # A new reader from now sees only what comes next.
    later = _attach(client, info, from_now=True)
    _input(client, info, stdin=b"again\n")
    assert _read_until(later, b"re:again").startswith(b"re:again")
    later.cancel()  # type: ignore[attr-defined]
    _input(client, info, signal=15)
    done = _wait(client, info)
    assert done.process.status.exit_code == 7
    assert b"got-term" in done.stdout


def test_wait_with_a_timeout_returns_running_and_close_stdin_ends_cat(client: Client) -> None:
    info = _start(client, argv=["cat"], stdin=True)
    assert _wait(client, info, seconds=0.3).process.state == "running"
    _input(client, info, stdin=b"abc")
    _input(client, info, close_stdin=True)
    done = _wait(client, info)
    assert done.process.status.exit_code == 0 and done.stdout == b"abc"


def test_a_terminal_has_a_controlling_tty_a_size_and_resizes(client: Client) -> None:
    info = _start(client, argv=["sh", "-c", "tty; stty size; read x; stty size; exit 3"],
                  pty=pb.PtySize(rows=30, cols=100))  # fmt: skip
    assert info.pty
    stream = _attach(client, info)
    seen = _read_until(stream, b"30 100")
    assert b"/dev/pts/" in seen
    _input(client, info, resize=pb.PtySize(rows=40, cols=120))
    _input(client, info, stdin=b"go\r")
    assert b"40 120" in _read_until(stream, b"40 120")
    done = _wait(client, info)
    assert done.process.status.exit_code == 3


def test_ctrl_c_on_a_terminal_interrupts_the_foreground_job(client: Client) -> None:
    # "ready" comes from the foreground child itself (which then becomes the sleep), so the
    # ^C cannot land between the shell's echo and its fork of sleep: there dash takes the
    # signal and runs the trap only once sleep ends (seen under load: still running at 10 s).
    script = (
        "trap 'echo trapped; exit 4' INT; sh -c 'echo ready; exec sleep 60'; echo not-interrupted"
    )
    info = _start(client, argv=["sh", "-c", script], pty=pb.PtySize(rows=24, cols=80))
    _read_until(_attach(client, info), b"ready")
    _input(client, info, stdin=b"\x03")  # the line discipline turns it into SIGINT
    done = _wait(client, info, seconds=10)
    assert done.process.status.exit_code == 4, done
    assert b"trapped" in done.stdout and b"not-interrupted" not in done.stdout


def test_bad_requests_are_clear_errors(client: Client) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _wait(client, pb.ProcessInfo(sandbox_id=SANDBOX_ID, process_id="p-nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        _start(client, argv=["sh"], pty=pb.PtySize(rows=0, cols=80))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        _start(client, argv=["/no/such/program"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = _start(client, argv=["true"])
    _wait(client, info)
    with pytest.raises(grpc.RpcError) as err:
        _input(client, info, resize=pb.PtySize(rows=10, cols=10))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(err.value) == "PROCESS_STATE"


# ------------------------------------------------------------ hostile sandbox

HOSTILE = "sb-bg-hostile"
SMALL_SHARES = {
    "ORCHARD_OUTPUT_MIB_PER_SANDBOX": "8",
    "ORCHARD_PROCESSES_PER_SANDBOX": "6",
    "ORCHARD_PROCESS_BUFFER_KIB": "4096",
}


@pytest.fixture(scope="module")
def small_node(node_home: Path, init_binary: Path) -> Iterator[tuple[ExecutorProcess, Client]]:
    box = HostSandbox(HOSTILE, node_home, init_binary).create()
    executor = ExecutorProcess.start(node_home, env=SMALL_SHARES)
    client = Client(executor.address, node_home)
    try:
        yield executor, client
    finally:
        client.close()
        executor.stop()
        box.stop()


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_floods_stay_inside_the_sandbox_share_and_the_process_cap(
    small_node: tuple[ExecutorProcess, Client],
) -> None:
    executor, client = small_node
    before = _rss(executor.process.pid)
    flood = "while :; do head -c 1048576 /dev/zero; done"
    floods = [_start(client, HOSTILE, shell=flood) for _ in range(6)]
    with pytest.raises(grpc.RpcError) as err:
        _start(client, HOSTILE, shell=flood)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    time.sleep(3)  # each flood writes far more than 8 MiB in this time
    listed = client.stub.ListProcesses(
        pb.ListProcessesRequest(sandbox_id=HOSTILE), metadata=client.metadata(HOSTILE)
    ).processes
    assert all(p.state == "running" for p in listed)
    assert sum(p.output_bytes - p.dropped_bytes for p in listed) <= 8 * MIB
    assert all(p.dropped_bytes > 0 for p in listed)
    # Six 4 MiB buffers would be 24 MiB; the sandbox's 8 MiB share holds.
    grown = _rss(executor.process.pid) - before
    assert grown < 64 * MIB, f"executor grew by {grown >> 20} MiB"
    # A reader from the start is told what it missed, then gets what is kept.
    first = next(iter(_attach(client, floods[0])))
    assert first.WhichOneof("kind") == "dropped" and first.dropped > 0
    pids = [p.pid for p in listed]
    for info in floods:
        _input(client, info, signal=9)
    for info in floods:
        assert _wait(client, info).process.status.signal == 9
    assert wait_gone(pids) == []
    # Finished, they no longer count: a new one starts.
    _wait(client, _start(client, HOSTILE, argv=["true"]))


def test_finished_results_are_kept_at_most_32_per_sandbox(client: Client) -> None:
    started = []
    for _ in range(40):
        started.append(_start(client, argv=["true"]))
        _wait(client, started[-1])
    _start(client, argv=["true"])  # a start sweeps
    listed = client.stub.ListProcesses(
        pb.ListProcessesRequest(sandbox_id=SANDBOX_ID), metadata=client.metadata(SANDBOX_ID)
    ).processes
    finished = [p for p in listed if p.state == "exited"]
    assert len(finished) <= 32
    ids = {p.process_id for p in listed}
    assert started[0].process_id not in ids  # the oldest went first
    with pytest.raises(grpc.RpcError) as err:
        _wait(client, started[0])
    assert error_reason(err.value) == "PROCESS_NOT_FOUND"
