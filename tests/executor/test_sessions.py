"""Persistent shell sessions through the real executor."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from orchard._proto.orchard.v1 import executor_pb2 as pb

from .conftest import SANDBOX_ID
from .harness import Client, error_reason


class Shell:
    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self.ref = pb.SessionRef(sandbox_id=SANDBOX_ID, session_id=session_id)

    def run(self, command: str, timeout: float = 0, cap: int = 0) -> pb.RunResponse:
        response: pb.RunResponse = self.client.stub.SessionRun(
            pb.SessionRunRequest(
                sandbox_id=SANDBOX_ID,
                session_id=self.session_id,
                command=command,
                timeout_seconds=timeout,
                max_output_bytes=cap,
            ),
            metadata=self.client.metadata(SANDBOX_ID),
            timeout=30,
        )
        return response

    def interrupt(self) -> None:
        self.client.stub.InterruptSession(self.ref, metadata=self.client.metadata(SANDBOX_ID))

    def close(self) -> None:
        self.client.stub.CloseSession(self.ref, metadata=self.client.metadata(SANDBOX_ID))


@pytest.fixture
def shell(client: Client) -> Iterator[Shell]:
    session = client.stub.CreateSession(
        pb.CreateSessionRequest(sandbox_id=SANDBOX_ID, cwd="/", env={"GREETING": "hi"}),
        metadata=client.metadata(SANDBOX_ID),
    )
    s = Shell(client, session.session_id)
    try:
        yield s
    finally:
        try:
            s.close()
        except grpc.RpcError as err:
            assert err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


def test_state_persists_between_commands(shell: Shell) -> None:
    assert (
        shell.run(
            "cd /tmp && export A=1; B=2; declare -a ARR=(x y); f() { echo fn $1; }"
        ).status.exit_code
        == 0
    )
    r = shell.run(
        'pwd; echo "$A $B ${ARR[1]} $GREETING"; f z; bash -c \'echo "child sees A=$A B=$B"\''
    )
    assert r.stdout == b"/tmp\n1 2 y hi\nfn z\nchild sees A=1 B=\n"
    assert r.stderr == b"" and r.status.exit_code == 0


def test_exit_codes_and_exact_output(shell: Shell) -> None:
    assert shell.run("false").status.exit_code == 1
    assert shell.run("(exit 42)").status.exit_code == 42
    r = shell.run("printf 'no newline'; printf 'err' >&2")
    assert (r.stdout, r.stderr) == (b"no newline", b"err")
    r = shell.run(r"printf '\377\000\200'")
    assert r.stdout == b"\xff\x00\x80"
    r = shell.run("head -c 3000000 /dev/zero")
    assert r.stdout == b"\0" * 3_000_000
    r = shell.run("head -c 3000000 /dev/zero; echo tail >&2", cap=100)
    assert r.stdout == b"\0" * 100 and r.status.stdout_truncated and r.stderr == b"tail\n"
    assert shell.run("echo still-in-sync").stdout == b"still-in-sync\n"
    assert shell.run('read x; echo "[$x]"').stdout == b"[]\n"  # stdin is /dev/null


def test_interrupt_stops_the_command_not_the_session(shell: Shell) -> None:
    result: list[pb.RunResponse] = []
    t = threading.Thread(target=lambda: result.append(shell.run("sleep 100; echo not-reached")))
    started = time.monotonic()
    t.start()
    time.sleep(0.3)
    shell.interrupt()
    t.join(10)
    assert result and result[0].status.exit_code == 130
    assert b"not-reached" not in result[0].stdout
    assert time.monotonic() - started < 5
    assert shell.run("echo alive").stdout == b"alive\n"


def test_busy_session_refuses_a_second_command(shell: Shell) -> None:
    t = threading.Thread(target=lambda: shell.run("sleep 1"))
    t.start()
    time.sleep(0.2)
    with pytest.raises(grpc.RpcError) as err:
        shell.run("echo second")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(err.value) == "SESSION_BUSY"
    t.join(10)
    assert shell.run("echo after").stdout == b"after\n"


def test_timeout_interrupts_and_the_session_survives(shell: Shell) -> None:
    r = shell.run("sleep 100", timeout=0.5)
    assert r.status.timed_out and r.status.exit_code == 130
    assert shell.run("echo ok").stdout == b"ok\n"


def test_timeout_kills_a_session_that_ignores_sigint(shell: Shell) -> None:
    r = shell.run("trap '' INT; sleep 100", timeout=0.3)
    assert r.status.timed_out and r.status.signal == 9
    assert b"session ended" in r.stderr
    with pytest.raises(grpc.RpcError) as err:
        shell.run("echo gone")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(err.value) == "SESSION_DEAD"


def test_exit_ends_the_session_clearly(shell: Shell) -> None:
    r = shell.run("echo bye; exit 3")
    assert r.stdout == b"bye\n" and r.status.exit_code == 3
    assert b"session ended: the session's shell exited (code 3)" in r.stderr
    with pytest.raises(grpc.RpcError) as err:
        shell.run("echo gone")
    assert error_reason(err.value) == "SESSION_DEAD"


def test_closed_and_unknown_sessions(client: Client, shell: Shell) -> None:
    shell.close()
    with pytest.raises(grpc.RpcError) as err:
        shell.run("true")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(err.value) == "SESSION_NOT_FOUND"
    with pytest.raises(grpc.RpcError) as err:
        Shell(client, "s-0000000000000000").run("true")
    assert error_reason(err.value) == "SESSION_NOT_FOUND"
