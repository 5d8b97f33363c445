"""The fake executor's commands: real host subprocesses with the real executor's outcomes,
or scripted results that run nothing."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import secrets
import time
from collections.abc import Iterator

import grpc
import pytest

from orchard import (
    CommandStartError,
    ExecStatus,
    InvalidRequestError,
    Orchard,
    OutputChunk,
    Sandbox,
    SessionError,
)
from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc
from orchard.testing import ExecCall, FakeOrchard, ScriptedResult


def _unique_sleep(seconds: int = 300) -> str:
    """A sleep command no other test (or other run on this host) has: commands are not
    isolated, so ``ps`` inside a fake sandbox sees the whole host."""
    return f"sleep {seconds}.{secrets.randbelow(10**6):06d}1"


def _wait_gone(sb: Sandbox, command: str) -> None:
    """Until ``command`` is no longer running (SIGKILL takes effect when the process is next
    scheduled, which under load can be a moment after the signal)."""
    deadline = time.monotonic() + 5
    while command.encode() in sb.exec(["ps", "-eo", "args"]).stdout:
        assert time.monotonic() < deadline, f"{command!r} still runs"
        time.sleep(0.05)


def test_exit_codes_signals_and_start_failures(client: Orchard) -> None:
    with client.sandboxes.create() as sb:
        assert sb.exec("exit 7").exit_code == 7
        killed = sb.exec("kill -TERM $$")
        assert (killed.exit_code, killed.status.signal) == (-15, 15)
        missing = sb.exec(["no-such-binary-here"])
        assert missing.exit_code == 127 and b"command not found" in missing.stderr
        nodir = sb.exec("true", cwd="/does/not/exist")
        assert nodir.exit_code == 126 and b"cannot change directory" in nodir.stderr


def test_cwd_env_and_user_are_mapped(fake: FakeOrchard, client: Orchard) -> None:
    with client.sandboxes.create(env={"FROM_SANDBOX": "s"}) as sb:
        sb.write_file("/etc/passwd", "agent:x:1000:1000::/home/agent:/bin/sh\n")
        sb.write_file("/home/agent/.keep", "")
        root = fake.root(sb.id)
        r = sb.exec(
            'pwd; echo "$FROM_SANDBOX $FROM_CALL $HOME $USER"',
            cwd="/home",
            env={"FROM_CALL": "c"},
            user="agent",
        )
        assert r.stdout_text.splitlines() == [f"{root}/home", f"s c {root}/home/agent agent"]
        with pytest.raises(CommandStartError):
            sb.exec("true", user="nobody-here")
        # As in the sandbox itself, ".." stops at "/" and a relative cwd starts there.
        assert sb.exec("pwd", cwd="/../..").stdout_text == f"{root}\n"
        assert sb.exec("pwd", cwd="home/agent").stdout_text == f"{root}/home/agent\n"
        os.symlink("/home", root / "homelink")  # an absolute link in cwd resolves in-root
        assert sb.exec("pwd", cwd="/homelink/agent").stdout_text == f"{root}/home/agent\n"


def test_timeout_kills_the_process_group(client: Orchard) -> None:
    with client.sandboxes.create() as sb:
        started = time.monotonic()
        a, b = _unique_sleep(), _unique_sleep()
        r = sb.exec(f"{a} & {b}; echo never", timeout=0.3)
        assert r.status.timed_out and r.status.signal == 9 and b"never" not in r.stdout
        assert time.monotonic() - started < 5
        _wait_gone(sb, a)
        _wait_gone(sb, b)


def test_background_job_survives_a_normal_exit_and_kill_all_ends_it(client: Orchard) -> None:
    with client.sandboxes.create() as sb:
        marker = _unique_sleep()
        r = sb.exec(f"{marker} >/dev/null 2>&1 & echo started", timeout=5)
        assert r.stdout == b"started\n"
        assert marker.encode() in sb.exec(["ps", "-eo", "args"]).stdout
        assert sb.kill_all() >= 1
        _wait_gone(sb, marker)


def test_output_caps_truncate(client: Orchard) -> None:
    with client.sandboxes.create() as sb:
        r = sb.exec("head -c 100000 /dev/zero; echo done >&2", max_output_bytes=1000)
        assert len(r.stdout) == 1000 and r.status.truncated and r.stderr == b"done\n"


def test_exec_stream_stdin_and_early_stop(client: Orchard) -> None:
    with client.sandboxes.create() as sb:
        events = list(
            sb.exec_stream(
                ["sh", "-c", "cat; printf e >&2; exit 3"], stdin=iter([b"x" * 300_000, b"y"])
            )
        )
        out = b"".join(
            e.data for e in events if isinstance(e, OutputChunk) and e.stream == "stdout"
        )
        assert out == b"x" * 300_000 + b"y"
        assert OutputChunk("stderr", b"e") in events
        assert isinstance(events[-1], ExecStatus) and events[-1].exit_code == 3
        loop = f"while :; do echo tick; {_unique_sleep(0)}; done"
        stream = sb.exec_stream(loop)
        assert next(stream) == OutputChunk("stdout", b"tick\n")
        stream.close()  # stopping early cancels the call, which kills the command
        _wait_gone(sb, loop)


def test_sessions_keep_state_interrupt_and_timeout(client: Orchard) -> None:
    with client.sandboxes.create() as sb:
        session = sb.session()
        session.run("f() { echo in-f; }; mkdir -p /tmp/x 2>/dev/null; cd /; Y=1")
        assert session.run("f; echo $Y").stdout == b"in-f\n1\n"
        slow = session.run("sleep 30; echo after", timeout=0.3)
        assert slow.status.timed_out and b"after" not in slow.stdout
        assert session.run("echo alive").stdout == b"alive\n"
        session.close()
        with pytest.raises(SessionError):
            session.run("echo closed")


def test_session_interrupt_from_another_thread(client: Orchard) -> None:
    with client.sandboxes.create() as sb, sb.session() as session:

        async def main() -> int:
            loop = asyncio.get_running_loop()
            running = loop.run_in_executor(None, session.run, "sleep 30")
            await asyncio.sleep(0.3)
            session.interrupt()
            return (await running).exit_code

        assert asyncio.run(main()) == 130


def test_refusals_of_the_real_executor() -> None:
    with FakeOrchard() as fake, fake.client() as client, client.sandboxes.create() as sb:
        with pytest.raises(InvalidRequestError):
            sb.exec("  ")
        with pytest.raises(InvalidRequestError):
            sb.exec("true", timeout=-1)
        info = sb.info()
        access = fake.world.issue_token(sb.id)[0]
        stub = executor_pb2_grpc.ExecutorServiceStub(
            fake.transport().channel(fake.executor_endpoint)
        )
        start = executor_pb2.ExecStart(sandbox_id=sb.id, argv=["true"], shell="true")
        with pytest.raises(grpc.RpcError) as both:
            stub.Run(
                executor_pb2.RunRequest(start=start),
                metadata=(("authorization", f"Bearer {access}"),),
            )
        assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        auth = (("authorization", f"Bearer {access}"),)
        for bad in (
            executor_pb2.ExecStart(sandbox_id=sb.id),  # neither argv nor shell
            executor_pb2.ExecStart(sandbox_id=sb.id, argv=[""]),
            executor_pb2.ExecStart(sandbox_id=sb.id, argv=["true"], timeout_seconds=-1),
            executor_pb2.ExecStart(sandbox_id=sb.id, argv=["true"], env={"A=B": "x"}),
            executor_pb2.ExecStart(sandbox_id=sb.id, argv=["true"], max_output_bytes=-1),
            executor_pb2.ExecStart(sandbox_id="Not An Id", argv=["true"]),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                stub.Run(executor_pb2.RunRequest(start=bad), metadata=auth)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        good = executor_pb2.ExecStart(sandbox_id=sb.id, argv=["true"])
        with pytest.raises(grpc.RpcError) as token:
            stub.Run(
                executor_pb2.RunRequest(start=good), metadata=(("authorization", "Bearer forged"),)
            )
        assert token.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert ("orchard-reason", "TOKEN_INVALID") in token.value.trailing_metadata()
        other = client.sandboxes.create()
        other_token = fake.world.issue_token(other.id)[0]
        with pytest.raises(grpc.RpcError) as crossed:
            stub.Run(
                executor_pb2.RunRequest(start=good),
                metadata=(("authorization", f"Bearer {other_token}"),),
            )
        assert crossed.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Revoke takes a notice signed with a token key the fake does not have.
        with pytest.raises(grpc.RpcError) as revoke:
            stub.Revoke(executor_pb2.RevokeRequest(sandbox_id=sb.id, notice="r1.k.x.y.0.sig"))
        assert revoke.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert ("orchard-reason", "REVOCATION_INVALID") in revoke.value.trailing_metadata()
        assert sb.exec("true").exit_code == 0  # the sandbox's own token still works
        assert info.state == "ready"


def test_scripted_results_run_nothing(tmp_path: object) -> None:
    with FakeOrchard(run_commands=False) as fake, fake.client() as client:
        fake.on_exec("pytest -q", ScriptedResult(stdout="1 passed\n", exit_code=0))
        fake.on_exec(
            re.compile(r"^git "), lambda call: ScriptedResult(stdout=call.cwd, exit_code=1)
        )
        fake.on_exec(
            lambda call: call.argv[:1] == ("cat",), lambda call: ScriptedResult(stdout=call.stdin)
        )
        with client.sandboxes.create() as sb:
            assert sb.exec("pytest -q").stdout == b"1 passed\n"
            r = sb.exec("git status", cwd="/repo")
            assert (r.exit_code, r.stdout) == (1, b"/repo")
            assert sb.exec(["cat"], stdin=b"echo me").stdout == b"echo me"
            events = list(sb.exec_stream(["cat"], stdin=[b"a", b"b"]))
            assert events[0] == OutputChunk("stdout", b"ab")
            with pytest.raises(CommandStartError, match="no scripted result"):
                sb.exec("rm -rf /")
            with sb.session() as session:
                assert session.run("pytest -q").stdout == b"1 passed\n"
                with pytest.raises(CommandStartError):
                    session.run("ls")
        commands = [c.command for c in fake.exec_calls]
        assert commands[:2] == ["pytest -q", "git status"]
        assert all(isinstance(c, ExecCall) for c in fake.exec_calls)


def test_scripted_times_and_newest_first(client: Orchard, fake: FakeOrchard) -> None:
    fake.on_exec("probe", "old")
    fake.on_exec("probe", "new", times=1)
    with client.sandboxes.create() as sb:
        assert sb.exec("probe").stdout == b"new"
        assert sb.exec("probe").stdout == b"old"


def test_interactive_stdin_and_signals_over_the_raw_stream(
    fake: FakeOrchard, client: Orchard
) -> None:
    """Exec is a real bidi stream: stdin is fed while output comes back, then a signal."""
    with client.sandboxes.create() as sb:
        token = fake.world.issue_token(sb.id)[0]
        stub = executor_pb2_grpc.ExecutorServiceStub(
            fake.transport().channel(fake.executor_endpoint)
        )
        outbox: queue.Queue[executor_pb2.ExecRequest | None] = queue.Queue()

        def requests() -> Iterator[executor_pb2.ExecRequest]:
            while (item := outbox.get()) is not None:
                yield item

        start = executor_pb2.ExecStart(
            sandbox_id=sb.id, shell="while read l; do echo got $l; done", stdin=True
        )
        outbox.put(executor_pb2.ExecRequest(start=start))
        call = stub.Exec(requests(), metadata=(("authorization", f"Bearer {token}"),))
        outbox.put(executor_pb2.ExecRequest(stdin=b"one\n"))
        assert next(call).stdout == b"got one\n"
        outbox.put(executor_pb2.ExecRequest(stdin=b"two\n"))
        assert next(call).stdout == b"got two\n"
        outbox.put(executor_pb2.ExecRequest(signal=15))
        last = next(call)
        assert (last.exit.exit_code, last.exit.signal) == (-15, 15)
        outbox.put(None)
