"""SWE-ReX's runtime contract on the Orchard runtime, against a real stack.

SWE-ReX's own runtime tests live in its repository (SWE-agent/SWE-ReX,
``tests/test_execution.py`` and ``tests/test_read_file.py``), not in the
wheel; each test here is written anew for the same behaviour and names the
upstream test it covers (``upstream: <file>::<test>``). The deployment is made
and started as SWE-agent does it: ``OrchardDeployment(...)``, ``start()``,
``.runtime``, ``stop()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import BashAction as A
from swerex.runtime.abstract import (
    BashInterruptAction,
    CloseBashSessionRequest,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)
from swerex.runtime.abstract import Command as C

import orchard
from orchard.integrations.swerex import (
    OrchardDeployment,
    OrchardRuntime,
    OrchardUnavailableError,
)
from tests.stack import REQUIRES_STACK, Stack

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(60)]
T = TypeVar("T")


class Loop:
    """One event loop for the module: the deployment's client channels live on it."""

    def __init__(self, runner: asyncio.Runner) -> None:
        self.runner = runner

    def __call__(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)


@pytest.fixture(scope="module")
def run() -> Iterator[Loop]:
    with asyncio.Runner() as runner:
        yield Loop(runner)


@pytest.fixture(scope="module")
def deployment(stack: Stack, run: Loop) -> Iterator[OrchardDeployment]:
    d = OrchardDeployment()
    with pytest.raises(DeploymentNotStartedError):
        d.runtime  # noqa: B018
    run(d.start())
    yield d
    sandbox_id = d.runtime.sandbox.id
    run(d.stop())
    assert not run(d.is_alive())
    state = orchard.Orchard().sandboxes.connect(sandbox_id).last_info.state
    assert state in ("deleting", "deleted")  # stop() deleted the sandbox


@pytest.fixture
def runtime(deployment: OrchardDeployment) -> OrchardRuntime:
    return deployment.runtime


@pytest.fixture
def shell(runtime: OrchardRuntime, run: Loop) -> Iterator[OrchardRuntime]:
    """upstream: tests/conftest.py::runtime_with_default_session"""
    run(runtime.create_session(CreateBashSessionRequest()))
    yield runtime
    run(runtime.close_session(CloseBashSessionRequest()))


def test_alive(deployment: OrchardDeployment, runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_server_alive"""
    assert run(runtime.is_alive())
    assert run(deployment.is_alive())


def test_dead_sandbox_is_not_alive_and_unavailable(stack: Stack, run: Loop) -> None:
    """upstream: test_execution.py::test_server_dead (a runtime whose sandbox is gone)"""

    async def scenario() -> None:
        d = OrchardDeployment()
        await d.start()
        async with orchard.AsyncOrchard() as other:
            await other.sandboxes.delete(d.runtime.sandbox.id)
            # the delete answers at "deleting"; the container goes right after
            for _ in range(300):
                if (
                    await other.sandboxes.connect(d.runtime.sandbox.id)
                ).last_info.state == "deleted":
                    break
                await asyncio.sleep(0.1)
        alive = await d.is_alive()
        assert not alive and alive.message
        with pytest.raises(OrchardUnavailableError):
            await d.runtime.execute(C(command=["true"]))
        await d.stop()

    run(scenario())


def test_read_write_file(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_read_write_file"""
    run(runtime.write_file(WriteFileRequest(path="/tmp/rex/test.txt", content="test")))
    assert run(runtime.read_file(ReadFileRequest(path="/tmp/rex/test.txt"))).content == "test"
    cat = run(runtime.execute(C(command=["cat", "/tmp/rex/test.txt"])))
    assert cat.stdout == "test"


def test_read_non_existent_file(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_read_non_existent_file"""
    with pytest.raises(FileNotFoundError):
        run(runtime.read_file(ReadFileRequest(path="non_existent.txt")))
    with pytest.raises(IsADirectoryError):
        run(runtime.read_file(ReadFileRequest(path="/etc")))


def test_write_to_non_existent_directory(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_write_to_non_existent_directory"""
    run(runtime.write_file(WriteFileRequest(path="/tmp/new/dir/test.txt", content="x")))
    assert run(runtime.read_file(ReadFileRequest(path="/tmp/new/dir/test.txt"))).content == "x"


def test_read_large_file(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_read_large_file"""
    run(
        runtime.execute(
            C(command="head -c 1048576 /dev/zero | tr '\\0' x > /tmp/large", shell=True)
        )
    )
    assert len(run(runtime.read_file(ReadFileRequest(path="/tmp/large"))).content) == 1 << 20


@pytest.mark.parametrize("errors", [None, "strict"])
@pytest.mark.parametrize(
    ("encoding", "content"), [("utf-8", b"before \xde after"), ("utf-16-le", b"a\x00b")]
)
def test_read_file_decode_error(
    runtime: OrchardRuntime,
    run: Loop,
    tmp_path: Path,
    encoding: str,
    content: bytes,
    errors: str | None,
) -> None:
    """upstream: test_read_file.py::test_read_file_decode_error (the same error as Path.read_text)"""
    local = tmp_path / "invalid.txt"
    local.write_bytes(content)
    with pytest.raises(UnicodeDecodeError) as expected:
        local.read_text(encoding=encoding, errors=errors)
    run(runtime.upload(UploadRequest(source_path=str(local), target_path="/tmp/invalid.txt")))
    with pytest.raises(UnicodeDecodeError) as actual:
        run(
            runtime.read_file(
                ReadFileRequest(path="/tmp/invalid.txt", encoding=encoding, errors=errors)
            )
        )
    assert (actual.value.args, str(actual.value)) == (expected.value.args, str(expected.value))


@pytest.mark.parametrize(
    ("encoding", "errors", "content"),
    [
        (None, None, b"plain text\r\nwindows line"),
        ("utf-8", None, "calf\u00e9".encode()),
        ("latin-1", None, b"calf\xe9"),
        ("utf-8", "replace", b"before \xde after"),
        ("utf-8", "backslashreplace", b"before \xde after"),
        ("utf-8", "ignore", b"before \xde after"),
    ],
)
def test_read_file_encoding_and_errors(
    runtime: OrchardRuntime,
    run: Loop,
    tmp_path: Path,
    encoding: str | None,
    errors: str | None,
    content: bytes,
) -> None:
    """upstream: test_read_file.py::test_read_file_encoding_and_errors"""
    local = tmp_path / "test.txt"
    local.write_bytes(content)
    run(runtime.upload(UploadRequest(source_path=str(local), target_path="/tmp/enc.txt")))
    got = run(
        runtime.read_file(ReadFileRequest(path="/tmp/enc.txt", encoding=encoding, errors=errors))
    )
    assert got.content == local.read_text(encoding=encoding, errors=errors)


def test_execute_command(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_execute_command, test_execute_command_shell_false"""
    assert (
        run(runtime.execute(C(command="echo 'hello world'", shell=True))).stdout == "hello world\n"
    )
    assert run(runtime.execute(C(command=["echo", "hello world"]))).stdout == "hello world\n"
    r = run(runtime.execute(C(command="echo out; echo err >&2; exit 3", shell=True)))
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 3)
    merged = run(
        runtime.execute(
            C(command="echo a; echo b >&2; echo c", shell=True, merge_output_streams=True)
        )
    )
    assert (merged.stdout, merged.stderr) == ("a\nb\nc\n", "")
    assert run(runtime.execute(C(command="kill -TERM $$", shell=True))).exit_code == -15
    env = run(
        runtime.execute(
            C(
                command=["sh", "-c", "echo $X; echo ${HOME:-nohome}"],
                env={"X": "1", "PATH": "/usr/bin:/bin"},
            )
        )
    )
    assert env.stdout == "1\nnohome\n"  # env replaces the environment, as in subprocess
    assert run(runtime.execute(C(command=["pwd"], cwd="/tmp"))).stdout == "/tmp\n"
    with pytest.raises(NonZeroExitCodeError, match="my message"):
        run(runtime.execute(C(command=["false"], check=True, error_msg="my message")))


def test_execute_command_timeout(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_execute_command_timeout"""
    with pytest.raises(CommandTimeoutError):
        run(runtime.execute(C(command=["sleep", "10"], timeout=0.1)))


def test_empty_command(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_empty_command"""
    run(runtime.execute(C(command="", shell=True, check=True)))
    run(runtime.execute(C(command="\n", shell=True, check=True)))


def test_create_close_shell(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_create_close_shell, test_close_shell_twice"""
    run(runtime.create_session(CreateBashSessionRequest(session="mynewsession")))
    with pytest.raises(SessionExistsError):
        run(runtime.create_session(CreateBashSessionRequest(session="mynewsession")))
    run(runtime.close_session(CloseBashSessionRequest(session="mynewsession")))
    with pytest.raises(SessionDoesNotExistError):
        run(runtime.close_session(CloseBashSessionRequest(session="mynewsession")))


def test_startup_source(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: the startup_source field of CreateBashSessionRequest (sourced first)"""
    run(
        runtime.write_file(
            WriteFileRequest(path="/tmp/rc.sh", content="export FROM_RC=yes\necho sourced\n")
        )
    )
    made = run(
        runtime.create_session(
            CreateBashSessionRequest(session="rc", startup_source=["/tmp/rc.sh"])
        )
    )
    assert made.output == "sourced\n"
    assert run(runtime.run_in_session(A(command="echo $FROM_RC", session="rc"))).output == "yes"
    run(runtime.close_session(CloseBashSessionRequest(session="rc")))


def test_non_existent_session(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_run_in_shell_non_existent_session, test_close_shell_non_existent_session"""
    with pytest.raises(SessionDoesNotExistError):
        run(runtime.run_in_session(A(command="echo 'hello world'", session="non_existent")))
    with pytest.raises(SessionDoesNotExistError):
        run(runtime.close_session(CloseBashSessionRequest(session="non_existent")))


def test_run_in_shell(shell: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_run_in_shell, test_run_in_shell_check_exit_code,
    test_command_fails_check_exit_code"""
    run(shell.run_in_session(A(command="echo 'hello world'", check="raise")))
    assert run(shell.run_in_session(A(command="doesntexit", check="silent"))).exit_code == 127
    assert run(shell.run_in_session(A(command="false && true", check="silent"))).exit_code == 1
    run(shell.run_in_session(A(command="false || true", check="raise")))
    with pytest.raises(NonZeroExitCodeError):
        run(shell.run_in_session(A(command="false", check="raise")))
    assert run(shell.run_in_session(A(command="false", check="ignore"))).exit_code is None


def test_state_persists_and_shells_are_isolated(runtime: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_multiple_isolated_shells"""
    run(runtime.create_session(CreateBashSessionRequest(session="shell1")))
    run(runtime.create_session(CreateBashSessionRequest(session="shell2")))

    async def both() -> None:
        await asyncio.gather(
            runtime.run_in_session(A(command="x=42; cd /tmp", session="shell1", check="raise")),
            runtime.run_in_session(A(command="y=24", session="shell2", check="raise")),
        )

    run(both())
    one = run(runtime.run_in_session(A(command="echo $x $y; pwd", session="shell1")))
    two = run(runtime.run_in_session(A(command="echo $x $y; pwd", session="shell2")))
    assert (one.output, two.output) == ("42\n/tmp", "24\n/")
    run(runtime.close_session(CloseBashSessionRequest(session="shell1")))
    run(runtime.close_session(CloseBashSessionRequest(session="shell2")))


def test_run_in_shell_timeout_then_interrupt(shell: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_run_in_shell_timeout, test_interrupt_session"""
    with pytest.raises(CommandTimeoutError):
        run(shell.run_in_session(A(command="sleep 10", timeout=0.5)))
    run(shell.run_in_session(BashInterruptAction()))
    assert run(shell.run_in_session(A(command="echo 'asdf'", check="raise"))).output == "asdf"


def test_interrupt_stops_a_running_command(shell: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_interrupt_session (the interrupt arriving while it runs)"""

    async def scenario() -> None:
        task = asyncio.create_task(
            shell.run_in_session(A(command="sleep 30; echo never", check="silent", timeout=20))
        )
        await asyncio.sleep(1.0)
        await shell.run_in_session(BashInterruptAction())
        observation = await task
        assert observation.exit_code == 130 and "never" not in observation.output

    run(scenario())
    assert run(shell.run_in_session(A(command="echo alive"))).output == "alive"


def test_command_shapes_in_shell(shell: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_empty_command_in_shell, test_command_with_linebreaks,
    test_multiple_commands_with_linebreaks_in_shell, test_bash_multiline_command_eof,
    test_run_in_shell_subshell_command, test_run_just_comment, test_run_in_shell_multiple_commands,
    test_run_in_shell_while_loop, test_run_in_shell_bashlex_errors, test_run_shell_check_exit_code,
    test_with_bashlex_errors, test_fail_bashlex_errors, test_echo_new_lines"""

    def out(command: str, check: str = "raise") -> tuple[str, int | None]:
        r = run(shell.run_in_session(A(command=command, check=check)))  # type: ignore[arg-type]
        return r.output, r.exit_code

    for empty in ("", "\n", "\n\n \n"):
        assert out(empty) == ("", 0)
    assert out("\n echo 'test'\n\n") == ("test", 0)
    assert out("\n\n\n echo 'test1' \n  \n \n echo 'test2' \n\n\n")[0].splitlines() == [
        "test1",
        "test2",
    ]
    heredoc = out("python3 <<EOF\nprint('hello world')\nprint('hello world 2')\nEOF")[0]
    assert heredoc.splitlines() == ["hello world", "hello world 2"]
    out("(sleep 10) &")
    assert out("# echo 'hello world'") == ("", 0)
    assert out("echo 'hello world'; echo 'hello again'")[0].splitlines() == [
        "hello world",
        "hello again",
    ]
    assert out("echo 'hello world' && echo 'hello again'")[0].splitlines() == [
        "hello world",
        "hello again",
    ]
    assert (
        out("for i in {1..3};\n do echo 'hello world';\n done")[0].splitlines()
        == ["hello world"] * 3
    )
    out("[[ $env == $env ]]")
    assert out("/usr/bin/env bash -n <<'EOF'\necho 'hello world'\nEOF", "silent") == ("", 0)
    assert out("echo 'hw';A=();echo 'asdf'") == ("hw\nasdf", 0)
    assert out("A=(); false", "silent") == ("", 1)
    assert out("echo 'hello\nworld'")[0].splitlines() == ["hello", "world"]
    assert out("echo to-stderr >&2; echo to-stdout") == ("to-stderr\nto-stdout", 0)


def test_check_bash_command_invalid(shell: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_check_bash_command_invalid"""
    with pytest.raises(BashIncorrectSyntaxError) as e:
        run(shell.run_in_session(A(command="(a")))
    assert "bash_stdout" in e.value.extra_info and "bash_stderr" in e.value.extra_info
    assert run(shell.run_in_session(A(command="echo still-fine"))).output == "still-fine"


def test_interactive_commands_are_refused_clearly(shell: OrchardRuntime, run: Loop) -> None:
    """upstream: test_execution.py::test_run_in_shell_interactive_command, test_interrupt_pager:
    not supported (no terminal sessions in today's SDK); refused, never half run."""
    with pytest.raises(NotImplementedError, match="terminal"):
        run(
            shell.run_in_session(A(command="python3", is_interactive_command=True, expect=[">>> "]))
        )


def test_upload_file_and_directory(shell: OrchardRuntime, run: Loop, tmp_path: Path) -> None:
    """upstream: test_execution.py::test_upload_file, test_upload_directory"""
    (tmp_path / "source.txt").write_text("test")
    run(
        shell.upload(
            UploadRequest(
                source_path=str(tmp_path / "source.txt"), target_path="/tmp/up/target.txt"
            )
        )
    )
    assert run(shell.read_file(ReadFileRequest(path="/tmp/up/target.txt"))).content == "test"
    source_dir = tmp_path / "source_dir"
    source_dir.mkdir()
    (source_dir / "file1.txt").write_text("test1")
    (source_dir / "file2.txt").write_text("test2")
    run(shell.upload(UploadRequest(source_path=str(source_dir), target_path="/tmp/target_dir")))
    for name, text in (("file1.txt", "test1"), ("file2.txt", "test2")):
        assert run(shell.read_file(ReadFileRequest(path=f"/tmp/target_dir/{name}"))).content == text
