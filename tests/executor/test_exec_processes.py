"""Process trees, timeouts, background jobs, streaming stdin/out, concurrency."""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc

from orchard._proto.orchard.v1 import executor_pb2 as pb

from .conftest import SANDBOX_ID
from .harness import Client, kill_pids, pid_alive, wait_gone


def _pids(text: bytes) -> list[int]:
    return [int(p) for p in text.split()]


def test_timeout_kills_the_whole_tree_even_setsid_double_forks(client: Client) -> None:
    script = (
        "sleep 300 & echo $!; "
        "setsid sh -c 'sleep 300 & echo $!; sleep 300' & "
        "(sh -c 'sleep 300 & echo $!' &); "
        "sleep 300"
    )
    started = time.monotonic()
    r = client.run(SANDBOX_ID, shell=script, timeout_seconds=1.0)
    pids = _pids(r.stdout)
    try:
        assert len(pids) == 3
        assert r.status.timed_out and r.status.signal == 9 and r.status.exit_code == -9
        assert time.monotonic() - started < 5
        assert wait_gone(pids) == []
    finally:
        kill_pids([p for p in pids if pid_alive(p)])


def test_background_job_does_not_hang_the_exec(client: Client) -> None:
    started = time.monotonic()
    # The background sleep keeps stdout and stderr open.
    r = client.run(SANDBOX_ID, shell="sleep 60 & echo $!")
    pids = _pids(r.stdout)
    try:
        assert r.status.exit_code == 0 and len(pids) == 1
        assert time.monotonic() - started < 3
        assert pid_alive(pids[0]), "a job started with & must keep running after the exec"
    finally:
        kill_pids(pids)
    assert wait_gone(pids) == []


def _exec(client: Client, requests: Iterator[pb.ExecRequest]) -> Iterator[pb.ExecEvent]:
    events: Iterator[pb.ExecEvent] = client.stub.Exec(
        requests, metadata=client.metadata(SANDBOX_ID), timeout=60
    )
    return events


def _collect(events: Iterator[pb.ExecEvent]) -> tuple[bytes, bytes, pb.ExecStatus]:
    out, err = bytearray(), bytearray()
    status: pb.ExecStatus | None = None
    for event in events:
        kind = event.WhichOneof("kind")
        assert status is None, "nothing may follow the exit event"
        if kind == "stdout":
            out += event.stdout
        elif kind == "stderr":
            err += event.stderr
        else:
            status = event.exit
    assert status is not None
    return bytes(out), bytes(err), status


def test_exec_streams_stdin_in_and_output_out(client: Client) -> None:
    chunks = [bytes([i]) * 100_000 for i in range(20)]

    def requests() -> Iterator[pb.ExecRequest]:
        yield pb.ExecRequest(start=pb.ExecStart(sandbox_id=SANDBOX_ID, argv=["cat"], stdin=True))
        for chunk in chunks:
            yield pb.ExecRequest(stdin=chunk)
        yield pb.ExecRequest(close_stdin=True)

    out, err, status = _collect(_exec(client, requests()))
    assert out == b"".join(chunks) and err == b"" and status.exit_code == 0


def test_exec_streams_50_mb_exactly(client: Client) -> None:
    start = pb.ExecStart(
        sandbox_id=SANDBOX_ID,
        shell="f=$(mktemp); head -c 50000000 /dev/urandom >$f; cat $f; sha256sum <$f >&2; rm $f",
        max_output_bytes=64 << 20,
    )
    out, err, status = _collect(_exec(client, iter([pb.ExecRequest(start=start)])))
    assert status.exit_code == 0 and not status.truncated
    assert len(out) == 50_000_000
    assert err.decode().split()[0] == hashlib.sha256(out).hexdigest()


def test_exec_signal_and_client_cancel_kill(client: Client) -> None:
    gate: queue.Queue[pb.ExecRequest | None] = queue.Queue()

    def requests() -> Iterator[pb.ExecRequest]:
        yield pb.ExecRequest(
            start=pb.ExecStart(sandbox_id=SANDBOX_ID, shell="echo ready; sleep 100")
        )
        while (item := gate.get()) is not None:
            yield item

    events = _exec(client, requests())
    first = next(events)
    assert first.stdout == b"ready\n"
    gate.put(pb.ExecRequest(signal=15))
    _, _, status = _collect(events)
    gate.put(None)
    assert status.signal == 15 and status.exit_code == -15

    # A client that goes away takes the whole tree with it.
    gate2: queue.Queue[pb.ExecRequest | None] = queue.Queue()

    def requests2() -> Iterator[pb.ExecRequest]:
        yield pb.ExecRequest(
            start=pb.ExecStart(sandbox_id=SANDBOX_ID, shell="sleep 300 & echo $!; sleep 300")
        )
        while (item := gate2.get()) is not None:
            yield item

    call = client.stub.Exec(requests2(), metadata=client.metadata(SANDBOX_ID), timeout=60)
    pids = _pids(next(call).stdout)
    try:
        call.cancel()
        gate2.put(None)
        assert wait_gone(pids) == []
    finally:
        kill_pids([p for p in pids if pid_alive(p)])


def test_64_concurrent_execs(client: Client) -> None:
    def one(i: int) -> tuple[int, bytes, int]:
        r = client.run(SANDBOX_ID, shell=f"echo {i}; exit {i % 7}")
        return i, r.stdout, r.status.exit_code

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(256)))
    for i, out, code in results:
        assert out == f"{i}\n".encode() and code == i % 7


def test_deadline_exceeded_kills_the_command(client: Client) -> None:
    done = threading.Event()
    pid_holder: list[int] = []

    def requests() -> Iterator[pb.ExecRequest]:
        yield pb.ExecRequest(start=pb.ExecStart(sandbox_id=SANDBOX_ID, shell="echo $$; sleep 300"))
        done.wait(10)

    call = client.stub.Exec(requests(), metadata=client.metadata(SANDBOX_ID), timeout=1.0)
    try:
        for event in call:
            if event.stdout:
                pid_holder.extend(_pids(event.stdout))
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        done.set()
    assert len(pid_holder) == 1
    assert wait_gone(pid_holder) == []
