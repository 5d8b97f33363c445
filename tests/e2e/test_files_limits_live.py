"""File operations, built-in errors, exit codes and argv limits through the real stack.

``orchard up`` with real runc sandboxes; every call through the SDK's sync and
async faces (gateway -> executor -> the sandbox's rootfs / init).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import pytest

import orchard
from orchard import AsyncOrchard, ExecStatus, Orchard, Sandbox
from orchard.common.exec_limits import MAX_ARG_STRLEN
from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("home")) as running:
        yield running


def _key(stack: Stack) -> str:
    return (stack.home / "dev-api-key").read_text().strip()


@pytest.fixture(scope="module")
def sb(stack: Stack) -> Iterator[Sandbox]:
    with Orchard(stack.endpoint, _key(stack)) as client, client.sandboxes.create(ttl=600) as box:
        yield box


def test_file_operations_sync(sb: Sandbox) -> None:
    assert sb.make_dir("/work/ops/sub/deeper", mode=0o750)
    assert not sb.make_dir("/work/ops/sub/deeper")
    sb.write_file("/work/ops/a.txt", "abc", mode=0o640)
    sb.exec("ln -s a.txt link && mkfifo pipe", cwd="/work/ops")
    entries = sb.list_dir("/work/ops", depth=3)
    assert [(e.path, e.type) for e in entries] == [
        ("/work/ops/a.txt", "file"),
        ("/work/ops/link", "symlink"),
        ("/work/ops/pipe", "fifo"),
        ("/work/ops/sub", "dir"),
        ("/work/ops/sub/deeper", "dir"),
    ]
    a = entries[0]
    assert (a.size, a.mode, a.uid, a.gid) == (3, 0o640, 0, 0) and a.mtime > 1.7e9
    assert entries[1].symlink_target == "a.txt" and entries[4].mode == 0o750
    only, truncated = sb.list_dir_page("/work/ops", max_entries=2)
    assert truncated and len(only) == 2
    link = sb.stat("/work/ops/link", follow_symlinks=False)
    assert (link.type, link.symlink_target) == ("symlink", "a.txt")
    assert sb.stat("/work/ops/link").size == 3
    assert sb.exists("/work/ops/a.txt") and not sb.exists("/work/ops/none")
    sb.rename("/work/ops/a.txt", "/work/ops/sub/b.txt")
    assert sb.read_file("/work/ops/sub/b.txt") == b"abc"
    # What the sandbox itself sees agrees.
    assert sb.exec("ls /work/ops/sub").stdout == b"b.txt\ndeeper\n"
    with pytest.raises(IsADirectoryError):
        sb.remove("/work/ops")  # not empty: only with recursive=True
    assert sb.remove("/work/ops", recursive=True) == 6
    assert not sb.exists("/work/ops")
    # Files and trees of the image itself: removed through overlayfs whiteouts; a
    # directory of the image cannot be renamed (overlayfs without redirect_dir says
    # EXDEV): refused with a message saying what to do, the original intact.
    sb.rename("/etc/hostname", "/work/hostname")
    assert sb.exists("/work/hostname") and not sb.exists("/etc/hostname")
    with pytest.raises(orchard.InvalidRequestError, match="copy it"):
        sb.rename("/etc/apt", "/work/apt")
    assert sb.exists("/etc/apt/sources.list.d") and not sb.exists("/work/apt")
    assert sb.remove("/usr/share/doc", recursive=True) > 100
    assert sb.exec("test -e /usr/share/doc; echo $?").stdout == b"1\n"


def test_builtin_exceptions_through_the_stack(sb: Sandbox) -> None:
    with pytest.raises(FileNotFoundError) as missing:
        sb.read_file("/work/does/not/exist")
    assert isinstance(missing.value, orchard.PathNotFoundError) and missing.value.errno == 2
    with pytest.raises(FileNotFoundError):
        sb.stat("/nowhere")
    with pytest.raises(IsADirectoryError):
        sb.read_file("/etc")
    sb.write_file("/work/plain", "x")
    with pytest.raises(NotADirectoryError):
        sb.list_dir("/work/plain")
    with pytest.raises(FileExistsError):
        sb.make_dir("/work/plain")
    with pytest.raises(FileExistsError):
        sb.make_dir("/work", exist_ok=False)
    try:
        sb.remove("/work/not-here")
    except FileNotFoundError as err:  # the way pathlib code is written
        assert isinstance(err, orchard.OrchardError) and "/work/not-here" in str(err)
    else:
        pytest.fail("no error for a missing path")


def test_owner_on_write_upload_and_mkdir(sb: Sandbox, tmp_path: pytest.TempPathFactory) -> None:
    sb.write_file("/work/own/by-daemon", "x", owner="daemon")
    sb.write_file("/work/own/by-ids", "x", owner=(1000, 1001))
    assert sb.make_dir("/work/own/dir", owner=1000)
    out = sb.exec("stat -c '%n %u %g' by-daemon by-ids dir", cwd="/work/own").stdout_text
    assert out.splitlines() == ["by-daemon 1 1", "by-ids 1000 1001", "dir 1000 0"]
    assert (sb.stat("/work/own/by-ids").uid, sb.stat("/work/own/by-ids").gid) == (1000, 1001)
    local = tmp_path / "tree"  # type: ignore[operator]
    (local / "d").mkdir(parents=True)
    (local / "d" / "f").write_text("hi")
    sb.upload(local, "/work/own/up", owner="daemon")
    out = sb.exec("stat -c '%n %u' up/d up/d/f", cwd="/work/own").stdout_text
    assert out.splitlines() == ["up/d 1", "up/d/f 1"]
    with pytest.raises(orchard.CommandStartError):
        sb.write_file("/work/own/x", "x", owner="no-such-user-xyz")
    uid_map = sb.exec("cat /proc/self/uid_map").stdout.split()
    if uid_map[:3] == [b"0", b"0", b"4294967295"]:  # no user namespace: any uid is the host's
        sb.write_file("/work/own/x", "x", owner=70000)
        assert sb.stat("/work/own/x").uid == 70000
    else:  # a user namespace maps only its range: an id outside it is refused, not "nobody"
        with pytest.raises(orchard.InvalidRequestError, match="user namespace"):
            sb.write_file("/work/own/x", "x", owner=70000)


def test_signal_exit_codes_follow_subprocess(sb: Sandbox) -> None:
    r = sb.exec("kill -TERM $$")
    assert (r.exit_code, r.signal, r.returncode) == (-signal.SIGTERM, signal.SIGTERM, -15)
    status = list(sb.exec_stream("kill -KILL $$"))[-1]
    assert isinstance(status, ExecStatus) and (status.exit_code, status.signal) == (-9, 9)
    with sb.session() as sh:
        r = sh.run("sh -c 'kill -INT $$'; echo $?")
        assert r.stdout == b"130\n"  # the shell's own convention inside the shell
    timed = sb.exec("sleep 30", timeout=0.5)
    assert timed.timed_out and timed.exit_code == -9


def test_argv_up_to_the_kernel_limit(sb: Sandbox) -> None:
    """Inspect AI's test_exec_large_command: sixteen 64 KiB arguments (1 MiB in all)."""
    args = [str(i % 10) * (64 * 1024) for i in range(16)]
    r = sb.exec(["sh", "-c", 'printf "%s" "$@" | wc -c', "sh", *args])
    assert r.exit_code == 0 and int(r.stdout) == 16 * 64 * 1024
    # One string at the kernel's per-string limit works; one byte more is refused by name.
    assert sb.exec(["true", "x" * (MAX_ARG_STRLEN - 1)]).exit_code == 0
    with pytest.raises(orchard.InvalidRequestError, match="MAX_ARG_STRLEN"):
        sb.exec(["true", "x" * MAX_ARG_STRLEN])
    # The total: the sandbox's stack limit / 4 (8 MiB stacks: 2 MiB); just past it is
    # refused with the rule named, just below it runs.
    space = int(sb.exec("ulimit -s").stdout) * 1024 // 4
    env_size = len(sb.exec("env -0").stdout)
    n = space // (MAX_ARG_STRLEN // 2)
    big = ["y" * (MAX_ARG_STRLEN // 2 - 1)] * (n + 1)
    with pytest.raises(orchard.InvalidRequestError, match="ARG_MAX") as refused:
        sb.exec(["true", *big])
    assert refused.value.code == "INVALID_ARGUMENT"
    fits = ["y" * (MAX_ARG_STRLEN // 2 - 1)] * ((space - env_size - 8192) // (MAX_ARG_STRLEN // 2))
    assert sb.exec(["true", *fits]).exit_code == 0
    # A big environment counts the same way (and works up to the same limit).
    env = {f"V{i}": "z" * 60_000 for i in range(16)}
    assert sb.exec(["sh", "-c", 'printf "%s" "$V15" | wc -c'], env=env).stdout == b"60000\n"


def test_async_face(stack: Stack) -> None:
    async def main() -> None:
        async with AsyncOrchard(stack.endpoint, _key(stack)) as client:
            box = await client.sandboxes.create(ttl=600)
            try:
                assert await box.make_dir("/work/a/b")
                await box.write_file("/work/a/b/f", "12345", owner="daemon")
                entries = await box.list_dir("/work/a", depth=2)
                assert [(e.path, e.type, e.uid) for e in entries] == [
                    ("/work/a/b", "dir", 0),
                    ("/work/a/b/f", "file", 1),
                ]
                assert (await box.stat("/work/a/b/f")).size == 5
                assert await box.exists("/work/a") and not await box.exists("/nope")
                await box.rename("/work/a/b/f", "/work/a/g")
                with pytest.raises(FileNotFoundError):
                    await box.read_file("/work/a/b/f")
                with pytest.raises(IsADirectoryError):
                    await box.remove("/work/a")
                assert await box.remove("/work/a", recursive=True) == 3
                with pytest.raises(FileExistsError):
                    await box.make_dir("/work", exist_ok=False)
                r = await box.exec("kill -TERM $$")
                assert (r.exit_code, r.signal) == (-15, 15)
                args = ["a" * (64 * 1024)] * 16
                r = await box.exec(["sh", "-c", 'echo "$#"', "sh", *args])
                assert r.stdout == b"16\n"
            finally:
                await box.delete()

    asyncio.run(main())
