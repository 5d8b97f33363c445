"""Run through the real executor: exit codes, signals, bytes, env, users, start failures."""

from __future__ import annotations

import grpc
import pytest

from .conftest import SANDBOX_ID
from .harness import Client, HostSandbox, error_reason


def test_true_and_exit_codes(client: Client) -> None:
    assert client.run(SANDBOX_ID, argv=["true"]).status.exit_code == 0
    r = client.run(SANDBOX_ID, shell="echo out; echo err >&2; exit 7")
    assert (r.stdout, r.stderr, r.status.exit_code, r.status.signal) == (b"out\n", b"err\n", 7, 0)
    assert r.status.duration_seconds > 0


@pytest.mark.parametrize("signum", [15, 9])
def test_killed_by_signal(client: Client, signum: int) -> None:
    r = client.run(SANDBOX_ID, shell=f"kill -{signum} $$; sleep 5")
    assert (r.status.exit_code, r.status.signal, r.status.timed_out) == (-signum, signum, False)


def test_binary_and_invalid_utf8_are_byte_exact(client: Client) -> None:
    data = bytes(range(256)) * 64 + b"\xff\xfe\xc3\x28 not utf-8 \x80"
    r = client.run(SANDBOX_ID, argv=["cat"], stdin=data)
    assert r.stdout == data
    r = client.run(SANDBOX_ID, shell=r"printf '\377\000\200x' >&2")
    assert r.stderr == b"\xff\x00\x80x"


def test_cwd_env_and_shell(client: Client) -> None:
    r = client.run(SANDBOX_ID, argv=["pwd"], cwd="/tmp")
    assert r.stdout == b"/tmp\n"
    r = client.run(
        SANDBOX_ID, shell='echo "$PATH|$HOME|$EXTRA"', env={"HOME": "/work", "EXTRA": "a b"}
    )
    path, home, extra = r.stdout.decode().strip().split("|")
    assert "/usr/bin" in path and home == "/work" and extra == "a b"


def test_users_are_resolved_in_the_sandbox(client: Client) -> None:
    r = client.run(SANDBOX_ID, shell='echo "$(id -u):$(id -g):$(id -G):$HOME:$USER"', user="alice")
    assert r.stdout == b"1000:1000:1000:/home/alice:alice\n"
    r = client.run(SANDBOX_ID, shell='echo "$(id -u):$(id -g)"', user="1000:staff")
    assert r.stdout == b"1000:50\n"
    r = client.run(SANDBOX_ID, shell='echo "$(id -u):$(id -g)"', user="4242")
    assert r.stdout == b"4242:0\n"
    with pytest.raises(grpc.RpcError) as err:
        client.run(SANDBOX_ID, argv=["true"], user="mallory")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(err.value) == "USER_NOT_FOUND"


def test_start_failures_look_like_a_shell(client: Client, sandbox: HostSandbox) -> None:
    r = client.run(SANDBOX_ID, argv=["no-such-command-xyz"])
    assert r.status.exit_code == 127 and b"no-such-command-xyz: command not found" in r.stderr
    r = client.run(SANDBOX_ID, argv=["/no/such/file"])
    assert r.status.exit_code == 127 and b"No such file or directory" in r.stderr
    not_executable = sandbox.dir / "plain-file"
    not_executable.write_text("echo hi\n")
    not_executable.chmod(0o644)
    r = client.run(SANDBOX_ID, argv=[str(not_executable)])
    assert r.status.exit_code == 126 and b"Permission denied" in r.stderr
    r = client.run(SANDBOX_ID, argv=["true"], cwd="/no/such/dir")
    assert r.status.exit_code == 126
    assert b"cannot change directory to /no/such/dir: No such file or directory" in r.stderr


@pytest.mark.parametrize(
    "start",
    [
        {},
        {"argv": ["true"], "shell": "true"},
        {"argv": [""]},
        {"argv": ["x" * (2 << 20)]},
        {"argv": ["true"], "env": {"A=B": "1"}},
        {"argv": ["true"], "env": {"A": "x\0y"}},
        {"argv": ["true"], "timeout_seconds": -1},
        {"argv": ["true"], "cwd": "/" + "d" * 5000},
        {"argv": ["true"], "max_output_bytes": -5},
    ],
)
def test_invalid_requests(client: Client, start: dict[str, object]) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.run(SANDBOX_ID, **start)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(err.value) == "INVALID_FIELD"
    assert err.value.details()


def test_output_cap_truncates_but_the_command_finishes(client: Client) -> None:
    r = client.run(
        SANDBOX_ID,
        shell="head -c 20000000 /dev/zero; echo done >&2",
        max_output_bytes=1000,
    )
    assert len(r.stdout) == 1000 and r.stdout == b"\0" * 1000
    assert r.stderr == b"done\n"
    assert r.status.exit_code == 0
    assert r.status.truncated and r.status.stdout_truncated and not r.status.stderr_truncated
