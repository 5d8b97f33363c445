"""orchard-init's inline-output mode and its spare shim, through the real binary.

Each test talks to a real orchard-init running as a host process, either
through the executor's asyncio client (:func:`run_inline`) or with a raw
socket where the test needs to misbehave as a client.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop
from orchard.executor.init_client import InitUnavailable, InlineOutcome, run_inline
from orchard.executor.init_protocol import (
    DATA_HEADER_SIZE,
    FLAG_INLINE_OUTPUT,
    FLAG_STDIN,
    InitRequest,
    StartFailure,
    encode_request,
)

from .harness import HostSandbox, kill_pids, pid_alive, wait_gone

PATH_ENV = ("PATH=/usr/local/bin:/usr/bin:/bin",)


@pytest.fixture(scope="module")
def box(node_home: Path, init_binary: Path) -> Iterator[HostSandbox]:
    sandbox = HostSandbox("sb-init-inline", node_home, init_binary).create()
    try:
        yield sandbox
    finally:
        sandbox.stop()


def _socket_path(box: HostSandbox) -> str:
    return str(box.dir / "init.sock")


def _inline(argv: tuple[str, ...], timeout_ms: int = 0) -> InitRequest:
    return InitRequest(argv=argv, env=PATH_ENV, cwd="/", timeout_ms=timeout_ms, inline_output=True)


def _run(box: HostSandbox, request: InitRequest, limit: int = 1 << 30) -> InlineOutcome:
    outcome = uvloop.run(run_inline(_socket_path(box), request, limit))
    assert isinstance(outcome, InlineOutcome), outcome
    return outcome


def test_stdout_and_stderr_arrive_whole_and_apart(box: HostSandbox) -> None:
    # Both streams well past one 64 KiB frame, written interleaved.
    script = "for i in $(seq 1 3000); do echo out$i; echo err$i >&2; done; exit 3"
    outcome = _run(box, _inline(("sh", "-c", script)))
    assert outcome.report.exit_code == 3
    assert outcome.stdout.data() == b"".join(b"out%d\n" % i for i in range(1, 3001))
    assert outcome.stderr.data() == b"".join(b"err%d\n" % i for i in range(1, 3001))
    assert not outcome.stdout.truncated and not outcome.stderr.truncated


def test_output_past_the_cap_is_dropped_but_the_command_finishes(box: HostSandbox) -> None:
    outcome = _run(box, _inline(("sh", "-c", "head -c 3000000 /dev/zero; echo done >&2")), 1000)
    assert outcome.report.exit_code == 0
    assert outcome.stdout.data() == b"\0" * 1000 and outcome.stdout.truncated
    assert outcome.stderr.data() == b"done\n" and not outcome.stderr.truncated


def test_a_background_job_holding_the_pipes_does_not_hang_it(box: HostSandbox) -> None:
    started = time.monotonic()
    outcome = _run(box, _inline(("sh", "-c", "sleep 60 & echo $!")))
    pids = [int(outcome.stdout.data())]
    try:
        assert outcome.report.exit_code == 0
        assert time.monotonic() - started < 2
        assert pid_alive(pids[0]), "a job started with & keeps running"
    finally:
        kill_pids(pids)


def test_the_timeout_kills_the_tree_and_is_reported(box: HostSandbox) -> None:
    outcome = _run(box, _inline(("sh", "-c", "sleep 300 & echo $!; sleep 300"), timeout_ms=300))
    pids = [int(outcome.stdout.data())]
    try:
        assert outcome.report.timed_out and outcome.report.signal == signal.SIGKILL
        assert wait_gone(pids) == []
    finally:
        kill_pids([p for p in pids if pid_alive(p)])


def test_a_command_that_cannot_start_is_a_start_failure(box: HostSandbox) -> None:
    outcome = uvloop.run(run_inline(_socket_path(box), _inline(("no-such-cmd-xyz",)), 1024))
    assert isinstance(outcome, StartFailure) and outcome.errno == 2


def test_the_client_going_away_kills_the_tree(box: HostSandbox) -> None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(10)
    conn.connect(_socket_path(box))
    conn.sendall(encode_request(_inline(("sh", "-c", "echo $$; sleep 300 & wait"))))
    header = conn.recv(DATA_HEADER_SIZE, socket.MSG_WAITALL)
    assert header[:2] == b"D\x01"
    pid = int(conn.recv(int.from_bytes(header[2:], "little"), socket.MSG_WAITALL))
    conn.close()
    try:
        assert wait_gone([pid]) == []
    finally:
        kill_pids([pid] if pid_alive(pid) else [])


def test_cancelling_run_inline_kills_the_command(box: HostSandbox, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    async def scenario() -> None:
        task = asyncio.create_task(
            run_inline(
                _socket_path(box),
                _inline(("sh", "-c", f"echo $$ > {pid_file}; exec sleep 300")),
                1024,
            )
        )
        deadline = time.monotonic() + 5
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    uvloop.run(scenario())
    pid = int(pid_file.read_text())
    try:
        assert wait_gone([pid]) == []
    finally:
        kill_pids([pid] if pid_alive(pid) else [])


@pytest.mark.parametrize("extra_flag", [FLAG_STDIN, 1 << 4])
def test_init_refuses_inline_with_stdin_and_unknown_flags(
    box: HostSandbox, extra_flag: int
) -> None:
    payload = bytearray(encode_request(_inline(("true",))))
    flags = int.from_bytes(payload[8:12], "little") | extra_flag
    assert flags & FLAG_INLINE_OUTPUT
    payload[8:12] = flags.to_bytes(4, "little")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(10)
    conn.connect(_socket_path(box))
    conn.sendall(bytes(payload))
    assert conn.recv(64) == b"", "a refused request ends the connection without an answer"
    conn.close()


def test_run_inline_reports_an_init_that_is_gone(tmp_path: Path) -> None:
    with pytest.raises(InitUnavailable):
        uvloop.run(run_inline(str(tmp_path / "nothing.sock"), _inline(("true",)), 1024))


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def test_the_spare_shim_waits_and_dies_with_init(node_home: Path, init_binary: Path) -> None:
    sandbox = HostSandbox("sb-init-spare", node_home, init_binary).create()
    assert sandbox.process is not None
    init_pid = sandbox.process.pid
    deadline = time.monotonic() + 5
    spares = _children(init_pid)
    while not spares and time.monotonic() < deadline:
        time.sleep(0.01)
        spares = _children(init_pid)
    try:
        assert len(spares) == 1, "init keeps exactly one spare shim while idle"
        # The spare serves the next connection; init then forks a new one.
        outcome = _run(sandbox, _inline(("echo", "hi")))
        assert outcome.stdout.data() == b"hi\n"
        assert wait_gone(spares) == []
        deadline = time.monotonic() + 5
        while not (spares := _children(init_pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(spares) == 1, "a new spare replaces the one that was taken"
        sandbox.stop()
        # On a host, a spare whose init died must not linger holding the socket.
        assert wait_gone(spares) == []
    finally:
        sandbox.stop()
        kill_pids([p for p in spares if pid_alive(p)])
