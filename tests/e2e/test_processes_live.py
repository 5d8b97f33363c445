"""Background processes and terminals through a real ``orchard up`` (runc sandboxes).

Sync and async faces; a process outliving the client that started it (the
client is closed, a new one in another OS process re-attaches); a terminal
allocated inside the sandbox; handles dying with the sandbox; and
``orchard shell`` in a real terminal under tmux (typed keys, the screen read
back with ``capture-pane``, a pane resize, Ctrl-C, the exit code).
"""

from __future__ import annotations

import asyncio
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import orchard
from orchard import AsyncOrchard, ExecStatus, Orchard, OutputChunk, OutputDropped
from tests.stack import ORCHARD, REQUIRES_STACK, Stack, running_stack

pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("procs") / "home") as running:
        yield running


def _key(stack: Stack) -> str:
    return (stack.home / "dev-api-key").read_text().strip()


def _text_until(events: Iterator[object], needle: bytes) -> bytes:
    seen = b""
    for event in events:
        if isinstance(event, OutputChunk):
            seen += event.data
            if needle in seen:
                return seen
    raise AssertionError(f"{needle!r} never came: {seen[-300:]!r}")


def test_a_process_outlives_its_client_and_another_process_reattaches(stack: Stack) -> None:
    first = Orchard(stack.endpoint, _key(stack))
    sb = first.sandboxes.create(memory="256Mi", ttl=600)
    try:
        proc = sb.start(
            "echo started; while read line; do echo got:$line; done; echo bye >&2; exit 4",
            stdin=True,
        )
        assert _text_until(proc.output(), b"started").startswith(b"started")
        first.close()  # every channel of the starting client is gone

        # Another OS process, another client: list, attach from the start, write, wait.
        script = textwrap.dedent(f"""
            from orchard import Orchard
            sb = Orchard({stack.endpoint!r}, {_key(stack)!r}).sandboxes.connect({sb.id!r})
            [info] = [p for p in sb.processes() if p.id == {proc.id!r}]
            assert info.state == "running" and info.argv[0] == "/bin/sh", info
            proc = sb.process({proc.id!r})
            proc.write("one\\n")
            proc.close_stdin()
            r = proc.wait(timeout=30)
            print(r.exit_code, r.stdout, r.stderr)
        """)
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "4 b'started\\ngot:one\\n' b'bye\\n'"

        again = Orchard(stack.endpoint, _key(stack)).sandboxes.connect(sb.id)
        replay = list(again.process(proc.id).output())
        assert isinstance(replay[-1], ExecStatus) and replay[-1].exit_code == 4
        [info] = [p for p in again.processes() if p.id == proc.id]
        assert info.state == "exited" and info.status is not None and info.status.exit_code == 4
        # Signals, and a wait that times out.
        sleeper = again.start(["sleep", "60"])
        with pytest.raises(orchard.DeadlineExceededError):
            sleeper.wait(timeout=0.5)
        sleeper.signal(15)
        assert sleeper.wait(timeout=30).status.signal == 15
    finally:
        Orchard(stack.endpoint, _key(stack)).sandboxes.delete(sb.id)


def test_a_terminal_in_a_runc_sandbox(stack: Stack) -> None:
    with Orchard(stack.endpoint, _key(stack)).sandboxes.create(memory="256Mi", ttl=600) as sb:
        term = sb.terminal(
            ["sh", "-c", "tty; stty size; read x; stty size; kill -INT $$"], rows=33, cols=101
        )
        seen = _text_until(term.output(), b"33 101")
        assert b"/dev/pts/" in seen
        term.resize(50, 132)
        term.write(b"go\r")
        result = term.wait(timeout=30)
        assert b"50 132" in result.stdout
        assert result.status.signal == 2
        with pytest.raises(orchard.ProcessError):
            term.resize(10, 10)  # it has exited
        with pytest.raises(orchard.ProcessError):
            sb.process("p-0000000000000000")


def test_handles_die_with_the_sandbox(stack: Stack) -> None:
    client = Orchard(stack.endpoint, _key(stack))
    sb = client.sandboxes.create(memory="256Mi", ttl=600)
    proc = sb.start(["sleep", "300"])
    assert proc.info().state == "running"
    sb.delete()
    # The delete answers at "deleting"; once the teardown is done the handle is dead.
    deadline = time.monotonic() + 30
    states = []
    with pytest.raises(orchard.SandboxNotFoundError):
        while time.monotonic() < deadline:
            states.append(proc.info().state)
            time.sleep(0.05)
    assert set(states) <= {"running", "lost"}, states


def test_output_past_the_buffer_is_dropped_and_counted(stack: Stack) -> None:
    with Orchard(stack.endpoint, _key(stack)).sandboxes.create(memory="256Mi", ttl=600) as sb:
        proc = sb.start("head -c 3000000 /dev/zero | tr '\\0' x; echo; echo end")
        result = proc.wait(timeout=60)
        assert result.status.truncated and result.stdout.endswith(b"\nend\n")
        assert len(result.stdout) <= 1 << 20
        events = list(proc.output())
        assert isinstance(events[0], OutputDropped) and events[0].bytes >= 3000000 - (1 << 20)
        info = proc.info()
        assert info.output_bytes == 3000000 + 5 and info.dropped_bytes == events[0].bytes


def test_the_async_face(stack: Stack) -> None:
    async def scenario() -> None:
        async with AsyncOrchard(stack.endpoint, _key(stack)) as client:
            sb = await client.sandboxes.create(memory="256Mi", ttl=600)
            try:
                proc = await sb.start(["cat"], stdin=True)
                await proc.write("async bytes")
                await proc.close_stdin()
                result = await proc.wait(timeout=30)
                assert (result.exit_code, result.stdout) == (0, b"async bytes")
                assert [p.id for p in await sb.processes()] == [proc.id]
                term = await sb.terminal(["sh", "-c", "stty size; read x; stty size"], 20, 60)
                seen = b""
                async for event in term.output():
                    if isinstance(event, OutputChunk):
                        seen += event.data
                        if b"20 60" in seen:
                            break
                await term.resize(21, 61)
                await term.write("\r")
                assert b"21 61" in (await term.wait(timeout=30)).stdout
                again = await client.sandboxes.connect(sb.id)
                assert (await (await again.process(proc.id)).poll()) is not None
                late = await sb.start(["sleep", "60"])
                assert await late.poll() is None
                await late.kill()
                assert (await late.wait(timeout=30)).status.signal == 9
            finally:
                await sb.delete()

    asyncio.run(scenario())


# ------------------------------------------------------------------- tmux


class Tmux:
    """One tmux server of this test (its own socket), killed by name of that socket."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket

    def __call__(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, timeout=10
        )
        assert out.returncode == 0, (args, out.stderr)
        return out.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "t")

    def wait_for(self, text: str, timeout: float = 20) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not on the screen:\n{screen}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (make system-deps)")
def test_orchard_shell_in_a_real_terminal(stack: Stack, tmp_path: Path) -> None:
    sandbox_id = stack.cli("create", "--memory", "256Mi", "--ttl", "600", check=True).stdout.strip()
    tmux = Tmux(tmp_path / "tmux.sock")
    status = tmp_path / "status"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in stack.env.items() if k.startswith("ORCHARD"))
    command = f"env {env} {shlex.join(ORCHARD)} shell {sandbox_id}; echo $? > {status}; sleep 30"
    tmux("new-session", "-d", "-s", "t", "-x", "100", "-y", "30", command)
    try:
        tmux.wait_for("#")  # the remote root shell's prompt
        tmux("send-keys", "-t", "t", "tty; echo tty-done-$((6*7))", "Enter")
        screen = tmux.wait_for("tty-done-42")  # the output, not the typed line
        assert "/dev/pts/" in screen
        tmux("send-keys", "-t", "t", "stty size", "Enter")
        tmux.wait_for("30 100")
        tmux("resize-window", "-t", "t", "-x", "120", "-y", "40")
        time.sleep(0.5)
        tmux("send-keys", "-t", "t", "stty size", "Enter")
        tmux.wait_for("40 120")
        # Ctrl-C reaches the remote foreground job, not the CLI.
        tmux("send-keys", "-t", "t", "sleep 100", "Enter")
        time.sleep(1.0)
        tmux("send-keys", "-t", "t", "C-c")
        tmux("send-keys", "-t", "t", "echo slept=$?", "Enter")
        tmux.wait_for("slept=130")
        # Job control: Ctrl-Z stops the foreground job, the shell lists it, `bg` runs it.
        tmux("send-keys", "-t", "t", "sleep 200", "Enter")
        time.sleep(1.0)
        tmux("send-keys", "-t", "t", "C-z")
        tmux.wait_for("Stopped")
        tmux("send-keys", "-t", "t", "bg; jobs", "Enter")
        tmux.wait_for("Running")
        tmux("send-keys", "-t", "t", "kill %1; exit 3", "Enter")
        deadline = time.monotonic() + 20
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status.read_text().strip() == "3", tmux.screen()
    finally:
        subprocess.run(["tmux", "-S", str(tmux.socket), "kill-server"], capture_output=True)
        stack.cli("rm", sandbox_id)
