"""The exec, session and file contract inside real runc containers, end to end.

tests/executor/ checks the executor against orchard-init running as a plain host
process; this suite checks the same contract where it matters: through the SDK,
the gateway and the node executor, into sandboxes that are real containers
(pid namespace, cgroups, overlayfs) of a real ``orchard up``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import orchard
from orchard import AsyncOrchard, ExecStatus, Orchard, OutputChunk, Sandbox
from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("contract") / "home") as running:
        yield running


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    return (stack.home / "dev-api-key").read_text().strip()


@pytest.fixture(scope="module")
def sb(stack: Stack, key: str) -> Iterator[Sandbox]:
    with Orchard(stack.endpoint, key).sandboxes.create(ttl=900, memory="512Mi") as box:
        yield box


def _procs(sb: Sandbox) -> list[str]:
    """Command lines of every process in the sandbox but init and the probe itself."""
    out = sb.exec(
        "for p in /proc/[0-9]*; do [ $p = /proc/1 ] || [ $p = /proc/$$ ] || "
        "tr '\\0' ' ' < $p/cmdline 2>/dev/null && echo; done"
    ).stdout_text
    return [line for line in out.splitlines() if line.strip() and "/proc/[0-9]" not in line]


def test_exit_codes_and_signals(sb: Sandbox) -> None:
    assert sb.exec("true").exit_code == 0
    assert sb.exec("exit 7").exit_code == 7
    killed = sb.exec("kill -TERM $$")
    assert (killed.status.signal, killed.exit_code) == (15, -15)
    missing = sb.exec(["no-such-binary"])
    assert missing.exit_code == 127 and b"not found" in missing.stderr


def test_timeout_kills_grandchildren_even_after_setsid_and_double_fork(sb: Sandbox) -> None:
    r = sb.exec(
        "sleep 300 & setsid sh -c 'sleep 301 & sleep 302' & (sh -c 'sleep 303 &') ; sleep 304",
        timeout=1,
    )
    assert r.status.timed_out
    leftover = [p for p in _procs(sb) if "sleep 30" in p]
    assert leftover == [], leftover


def test_background_job_survives_a_normal_exit(sb: Sandbox) -> None:
    r = sb.exec("sleep 120 >/dev/null 2>&1 & echo started", timeout=5)
    assert r.stdout == b"started\n" and not r.timed_out
    assert any("sleep 120" in p for p in _procs(sb))
    sb.exec("pkill -f 'sleep 120' || kill $(pgrep -f 'sleep 120')")


def test_stdin_binary_invalid_utf8_and_huge_output(sb: Sandbox) -> None:
    blob = bytes(range(256)) * 1000 + b"\xff\xfe\xc3("
    echoed = sb.exec(["cat"], stdin=blob)
    assert echoed.stdout == blob
    big = sb.exec(["head", "-c", str(40 << 20), "/dev/zero"], timeout=60, max_output_bytes=48 << 20)
    assert big.exit_code == 0 and len(big.stdout) == 40 << 20 and not big.status.truncated
    # Streamed, output is not bound by message sizes: 200 MiB arrive whole, in chunks.
    total, last = 0, None
    stream = sb.exec_stream(
        ["head", "-c", str(200 << 20), "/dev/zero"], timeout=120, max_output_bytes=256 << 20
    )
    for event in stream:
        if isinstance(event, OutputChunk):
            total += len(event.data)
        else:
            last = event
    assert last is not None and last.exit_code == 0 and total == 200 << 20
    events = list(sb.exec_stream(["sh", "-c", "printf a; sleep 0.2; printf b >&2; exit 3"]))
    assert OutputChunk("stdout", b"a") in events and OutputChunk("stderr", b"b") in events
    assert isinstance(events[-1], ExecStatus) and events[-1].exit_code == 3


def test_output_cap_truncates(sb: Sandbox) -> None:
    r = sb.exec("head -c 5000000 /dev/zero; echo done >&2", max_output_bytes=1 << 20, timeout=30)
    assert len(r.stdout) == 1 << 20 and r.status.truncated and r.stderr == b"done\n"


def test_many_concurrent_execs(stack: Stack, key: str) -> None:
    """64 streams, 20 execs each, under the default pids limit: every shim is reaped in time."""

    async def scenario() -> list[str]:
        async with await AsyncOrchard(stack.endpoint, key).sandboxes.create() as box:

            async def worker(i: int) -> str:
                outs = [(await box.exec(["echo", str(i)])).stdout_text for _ in range(20)]
                return outs[-1] if len(set(outs)) == 1 else f"mixed {outs}"

            return await asyncio.gather(*(worker(i) for i in range(64)))

    assert asyncio.run(scenario()) == [f"{i}\n" for i in range(64)]


def test_hitting_the_pids_limit_is_the_sandboxs_own_error(stack: Stack, key: str) -> None:
    async def scenario() -> list[BaseException | None]:
        async with await AsyncOrchard(stack.endpoint, key).sandboxes.create(pids=16) as box:

            async def one() -> None:
                await box.exec(["sleep", "0.3"])

            got = await asyncio.gather(*(one() for _ in range(40)), return_exceptions=True)
            assert (await box.exec(["echo", "ok"])).stdout == b"ok\n"  # it recovers
            return list(got)

    outcomes = asyncio.run(scenario())
    errors = [e for e in outcomes if e is not None]
    assert errors, "40 concurrent commands under pids=16 should not all start"
    wrong = [
        e for e in errors if not (isinstance(e, orchard.SandboxLimitError) and e.fault == "task")
    ]
    assert wrong == [], [f"{type(e).__name__}: {e}" for e in wrong]


def test_sessions_keep_state_and_interrupt(sb: Sandbox) -> None:
    with sb.session() as sh:
        sh.run("cd /tmp && export A=1 && f() { echo fn$1; }")
        assert sh.run("pwd; echo $A; f 2").stdout_text == "/tmp\n1\nfn2\n"
        assert sh.run("false").exit_code == 1
        slow = sh.run("sleep 100", timeout=0.5)
        assert slow.timed_out
        assert sh.run("echo still").stdout == b"still\n"


def test_files_round_trip_and_escapes(sb: Sandbox, tmp_path: Path) -> None:
    data = os.urandom(8 << 20)
    sb.write_file("/work/big.bin", data)
    assert hashlib.sha256(sb.read_file("/work/big.bin")).digest() == hashlib.sha256(data).digest()
    assert (
        sb.exec("sha256sum /work/big.bin").stdout_text.split()[0]
        == hashlib.sha256(data).hexdigest()
    )
    with pytest.raises(orchard.PathEscapeError):
        sb.read_file("../../../etc/shadow")
    sb.exec("ln -s /etc /work/etc-link && mkfifo /work/fifo")
    assert b"root:" in sb.read_file("/work/etc-link/passwd")  # the sandbox's own /etc
    with pytest.raises(orchard.PathError):
        sb.read_file("/work/fifo")
    with pytest.raises(orchard.PathError):
        sb.read_file("/dev/null")
    src = tmp_path / "tree"
    (src / "d").mkdir(parents=True)
    for i in range(200):
        (src / "d" / f"f{i}").write_text(str(i))
    sb.upload(src, "/work/tree")
    assert sb.exec("ls /work/tree/d | wc -l").stdout_text.strip() == "200"
    sb.download("/work/tree", tmp_path / "back")
    assert sorted(p.name for p in (tmp_path / "back" / "d").iterdir()) == sorted(
        f"f{i}" for i in range(200)
    )
