"""orchard.testing's fake answers like the real stack: the same scenarios through the same
SDK, against ``orchard up`` (real runc containers) and against ``FakeOrchard``, must end
the same way (the same result, or the same exception class, gRPC code and reason).

Only what the fake promises to match is compared: refusals and their reasons, exit
codes, signals, timeouts, caps, sessions, confined file calls. What it documents as
different (the image's file system, isolation, limits) is not.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard import Orchard, OrchardError, Sandbox
from orchard._proto.orchard.v1 import executor_pb2
from orchard.client._core import translate_errors
from orchard.common.exec_limits import MAX_ARG_STRLEN
from orchard.testing import FakeOrchard
from tests.stack import REQUIRES_STACK, running_stack

pytestmark = REQUIRES_STACK

Outcome = tuple[Any, ...]


def _outcome(fn: Callable[[], Any]) -> Outcome:
    try:
        return ("ok", fn())
    except OrchardError as exc:
        return ("error", type(exc).__name__, exc.code, exc.reason)


def _exec(sb: Sandbox, cmd: Any, **kw: Any) -> Outcome:
    r = sb.exec(cmd, **kw)
    return (r.exit_code, r.status.signal, r.status.timed_out, r.status.truncated, r.stdout)


SANDBOX_SCENARIOS: dict[str, Callable[[Sandbox], Any]] = {
    "read a missing file": lambda sb: sb.read_file("/work/missing"),
    "read above the root": lambda sb: sb.read_file("/work/../../x"),
    "read a directory": lambda sb: sb.read_file("/"),
    "write without parents": lambda sb: sb.write_file("/nope/deeper/x", "1", make_parents=False),
    "write a bad mode": lambda sb: sb.write_file("/work/m", "1", mode=0o170000),
    "write over a directory": lambda sb: (
        sb.write_file("/work/d/x", "1"),
        sb.write_file("/work/d", "2"),
    ),
    "write then read": lambda sb: (
        sb.write_file("/work/f.txt", "hello", mode=0o600),
        sb.read_file("/work/f.txt"),
    ),
    "exit code": lambda sb: _exec(sb, "exit 7"),
    "killed by a signal": lambda sb: _exec(sb, "kill -TERM $$"),
    "command not found": lambda sb: _exec(sb, ["no-such-binary-xyz"])[0],
    "missing cwd": lambda sb: _exec(sb, "true", cwd="/no/such/dir")[0],
    "relative cwd": lambda sb: (
        sb.write_file("/work/rel/f", "x"),
        _exec(sb, "cat f", cwd="work/rel"),
    ),
    "unknown user": lambda sb: sb.exec("true", user="no-such-user-xyz"),
    "timeout": lambda sb: _exec(sb, "sleep 30", timeout=0.5)[:4],
    "output cap": lambda sb: _exec(sb, "head -c 5000 /dev/zero", max_output_bytes=1000)[:4],
    "stdin": lambda sb: sb.exec(["cat"], stdin=b"piped\x00bytes").stdout,
    "a fifo is not a file": lambda sb: (
        sb.exec("mkdir -p work && mkfifo work/fifo", cwd="/"),
        sb.read_file("/work/fifo"),
    )[1],
    "an absolute link resolves in the sandbox": lambda sb: (
        sb.write_file("/data/secret", "s"),
        sb.write_file("/work/.keep", ""),
        sb.exec("ln -s /data/secret link", cwd="/work"),
        sb.read_file("/work/link"),
    )[3],
    "a tree round trip": lambda sb: _tree_round_trip(sb),
    "a session keeps state": lambda sb: _session_state(sb),
    "a closed session": lambda sb: _closed_session(sb),
    "a session interrupted by its timeout": lambda sb: _session_timeout(sb),
    "a port nothing listens on": lambda sb: sb.connect_port(9),
    "a port forward to a non-loopback host": lambda sb: sb.forward_port(80, host="10.0.0.1"),
    "a raw port stream to a non-loopback host": lambda sb: _raw_port(
        sb, _port_open(sb, 80, "10.0.0.1")
    ),
    "a raw port stream to port 0": lambda sb: _raw_port(sb, _port_open(sb, 0, "")),
    "a raw port stream without open": lambda sb: _raw_port(sb, executor_pb2.PortRequest(data=b"x")),
    # File operations (services/executor/files/listing.py, removal.py, directories.py).
    "list a tree": lambda sb: _list_tree(sb),
    "list a file": lambda sb: (sb.write_file("/work/lf", "x"), sb.list_dir("/work/lf"))[1],
    "list above the root": lambda sb: sb.list_dir("/work/../.."),
    "list too deep": lambda sb: sb.list_dir("/", depth=65),
    "stat a missing path": lambda sb: sb.stat("/work/missing"),
    "stat a link itself": lambda sb: _stat_link(sb),
    "exists": lambda sb: (
        sb.write_file("/work/e", ""),
        sb.exists("/work/e"),
        sb.exists("/work/not-here"),
    )[1:],
    "remove a non-empty directory": lambda sb: (
        sb.write_file("/work/rd/f", "x"),
        sb.remove("/work/rd"),
    ),
    "remove a tree": lambda sb: (
        sb.write_file("/work/rt/a/b", "x"),
        sb.write_file("/work/rt/c", "y"),
        sb.remove("/work/rt", recursive=True),
        sb.exists("/work/rt"),
    )[2:],
    "remove the root": lambda sb: sb.remove("/", recursive=True),
    "remove a missing path": lambda sb: sb.remove("/work/gone"),
    "rename": lambda sb: (
        sb.write_file("/work/rn/a", "a"),
        sb.rename("/work/rn/a", "/work/rn/b"),
        sb.read_file("/work/rn/b"),
        sb.exists("/work/rn/a"),
    )[2:],
    "rename into itself": lambda sb: (sb.make_dir("/work/ri"), sb.rename("/work/ri", "/work/ri/x")),
    "rename a missing path": lambda sb: sb.rename("/work/nothing", "/work/other"),
    "make_dir without parents": lambda sb: sb.make_dir("/work/np/a/b", parents=False),
    "make_dir over a file": lambda sb: (sb.write_file("/work/mf", ""), sb.make_dir("/work/mf")),
    "make_dir twice": lambda sb: (
        sb.make_dir("/work/md", mode=0o700),
        sb.make_dir("/work/md"),
        oct(sb.stat("/work/md").mode),
        sb.make_dir("/work/md", exist_ok=False),
    ),
    "write for an unknown owner": lambda sb: sb.write_file("/work/o", "x", owner="no-such-xyz"),
    # The kernel's execve limits (orchard.common.exec_limits), not a stricter round number.
    "sixteen 64 KiB arguments": lambda sb: _exec(
        sb, ["sh", "-c", 'echo "$#"', "sh"] + ["a" * 65536] * 16
    ),
    "an argument past MAX_ARG_STRLEN": lambda sb: sb.exec(["true", "x" * MAX_ARG_STRLEN]),
    "argv past ARG_MAX": lambda sb: sb.exec(["true"] + ["y" * 65535] * 200),
    "a background process's result": lambda sb: _result(
        sb.start("echo out; echo err >&2; exit 3").wait(timeout=30)
    ),
    "a background process fed and signalled": lambda sb: _fed_and_signalled(sb),
    "input to a process without stdin": lambda sb: _without_stdin(sb),
    "an unknown process": lambda sb: sb.process("p-0000000000000000"),
    "a process that cannot start": lambda sb: sb.start(["no-such-binary-xyz"]),
    "a bad terminal size": lambda sb: sb.terminal(["true"], rows=0, cols=80),
    "a terminal's size": lambda sb: _result(
        sb.terminal(["stty", "size"], rows=7, cols=33).wait(timeout=30)
    ),
}


def _port_open(sb: Sandbox, port: int, host: str) -> executor_pb2.PortRequest:
    return executor_pb2.PortRequest(
        open=executor_pb2.PortOpen(sandbox_id=sb.id, port=port, host=host)
    )


def _raw_port(sb: Sandbox, first: executor_pb2.PortRequest) -> Any:
    """A ConnectPort stream past the SDK's own checks."""
    stub, access = sb._executor()
    with translate_errors():
        return [
            e.WhichOneof("kind") for e in stub.ConnectPort(iter([first]), metadata=access.metadata)
        ]


def _list_tree(sb: Sandbox) -> Any:
    sb.write_file("/work/lt/a.txt", "abc", mode=0o640)
    sb.make_dir("/work/lt/sub/deeper", mode=0o750)
    sb.exec("ln -s a.txt link", cwd="/work/lt")
    return [
        (e.path, e.type, e.size if not e.is_dir else 0, oct(e.mode), e.symlink_target)
        for e in sb.list_dir("/work/lt", depth=3)
    ]


def _stat_link(sb: Sandbox) -> Any:
    sb.write_file("/work/sl/target", "12345")
    sb.exec("ln -s target link", cwd="/work/sl")
    link = sb.stat("/work/sl/link", follow_symlinks=False)
    followed = sb.stat("/work/sl/link")
    return (link.type, link.symlink_target, followed.type, followed.size, followed.path)


def _result(r: Any) -> Outcome:
    return (r.exit_code, r.status.signal, r.status.timed_out, r.stdout, r.stderr)


def _fed_and_signalled(sb: Sandbox) -> Any:
    cat = sb.start(["cat"], stdin=True)
    cat.write("fed")
    cat.close_stdin()
    sleeper = sb.start(["sleep", "30"])
    sleeper.signal(15)
    return _result(cat.wait(timeout=30)), _result(sleeper.wait(timeout=30))


def _without_stdin(sb: Sandbox) -> Any:
    proc = sb.start(["sleep", "30"])
    try:
        return proc.write("x")
    finally:
        proc.kill()


def _tree_round_trip(sb: Sandbox) -> Any:
    """Files written, a link made by a command, the tree downloaded: what lands locally."""
    sb.write_file("/work/tree/a.txt", "a")
    sb.write_file("/work/tree/sub/b.bin", b"\x00\xff", mode=0o750)
    sb.exec("ln -sf a.txt link", cwd="/work/tree")
    with tempfile.TemporaryDirectory() as out:
        sb.download("/work/tree", out)
        listing = []
        for path in sorted(Path(out).rglob("*")):
            st = path.lstat()
            content = (
                os.readlink(path)
                if path.is_symlink()
                else path.read_bytes()
                if path.is_file()
                else ""
            )
            listing.append((str(path.relative_to(out)), oct(st.st_mode), content))
        return listing


def _session_state(sb: Sandbox) -> Any:
    with sb.session() as s:
        s.run("cd /tmp && X=41 && f() { echo $((X + 1)); }")
        return s.run("f; pwd").stdout


def _closed_session(sb: Sandbox) -> Any:
    s = sb.session()
    s.close()
    return s.run("true")


def _session_timeout(sb: Sandbox) -> Any:
    with sb.session() as s:
        r = s.run("sleep 30", timeout=0.5)
        return (r.status.timed_out, s.run("echo alive").stdout)


def _tar(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o644
    data = b"x" if kind == tarfile.REGTYPE else b""
    info.size = len(data)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _raw_upload(sb: Sandbox, data: bytes) -> Any:
    """An Upload of hand-made tar bytes (the SDK only ever sends well-formed trees)."""
    stub, access = sb._executor()
    requests = iter(
        [
            executor_pb2.UploadRequest(
                header=executor_pb2.UploadHeader(sandbox_id=sb.id, path="/work/up")
            ),
            executor_pb2.UploadRequest(data=data),
        ]
    )
    with translate_errors():
        return stub.Upload(requests, metadata=access.metadata).files


TAR_SCENARIOS = {
    "an absolute member": _tar("/etc/evil"),
    "a climbing member": _tar("../../evil"),
    "a symlink to an absolute path": _tar("ln", tarfile.SYMTYPE, "/etc/passwd"),
    "a symlink climbing out": _tar("ln", tarfile.SYMTYPE, "../../../x"),
    "a hard link out": _tar("hard", tarfile.LNKTYPE, "../outside"),
    "a device node": _tar("dev", tarfile.CHRTYPE),
    "a fifo": _tar("fifo", tarfile.FIFOTYPE),
    "a plain file": _tar("ok.txt"),
    "not a tar stream": b"definitely not a tar stream" * 30,
}


@pytest.mark.parametrize("name", list(TAR_SCENARIOS))
def test_hostile_uploads_end_the_same(name: str, sandboxes: tuple[Sandbox, Sandbox]) -> None:
    real, fake = sandboxes
    data = TAR_SCENARIOS[name]
    assert _outcome(lambda: _raw_upload(fake, data)) == _outcome(lambda: _raw_upload(real, data))


CLIENT_SCENARIOS: dict[str, Callable[[Orchard], Any]] = {
    "unknown sandbox": lambda c: c.sandboxes.connect("sb-doesnotexist0"),
    "bad image name": lambda c: c.sandboxes.create(image="Bad Image!"),
    "unknown image": lambda c: c.sandboxes.create(image="no-such-image-xyz"),
    "ttl too long": lambda c: c.sandboxes.create(ttl=10**9),
    "bad label": lambda c: c.sandboxes.create(labels={"bad key!": "v"}),
    "bad env name": lambda c: c.sandboxes.create(env={"1BAD": "v"}),
    "unknown template": lambda c: c.sandboxes.create(template="no-such-template"),
    "delete twice": lambda c: _delete_twice(c),
}


def _delete_twice(c: Orchard) -> Any:
    sb = c.sandboxes.create()
    sb.delete()
    sb.delete()
    # The real stack answers once the record says DELETING (teardown goes on behind);
    # the fake's delete is done at once. Both are "gone" to a client.
    return c.sandboxes.connect(sb.id).last_info.state in ("deleting", "deleted")


@pytest.fixture(scope="module")
def deployments(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, FakeOrchard]]:
    """The real stack's endpoint and key, and a fake."""
    with running_stack(tmp_path_factory.mktemp("home")) as stack, FakeOrchard() as fake:
        yield stack.endpoint, (stack.home / "dev-api-key").read_text().strip(), fake


@pytest.fixture(scope="module")
def clients(deployments: tuple[str, str, FakeOrchard]) -> Iterator[tuple[Orchard, Orchard]]:
    endpoint, key, fake = deployments
    with Orchard(endpoint, key) as real, fake.client() as faked:
        yield real, faked


@pytest.fixture(scope="module")
def sandboxes(clients: tuple[Orchard, Orchard]) -> Iterator[tuple[Sandbox, Sandbox]]:
    real, faked = clients
    with real.sandboxes.create() as a, faked.sandboxes.create() as b:
        yield a, b


@pytest.mark.parametrize("name", list(SANDBOX_SCENARIOS))
def test_sandbox_scenarios_end_the_same(name: str, sandboxes: tuple[Sandbox, Sandbox]) -> None:
    real, fake = sandboxes
    scenario = SANDBOX_SCENARIOS[name]
    assert _outcome(lambda: scenario(fake)) == _outcome(lambda: scenario(real))


@pytest.mark.parametrize("name", list(CLIENT_SCENARIOS))
def test_client_scenarios_end_the_same(name: str, clients: tuple[Orchard, Orchard]) -> None:
    real, fake = clients
    scenario = CLIENT_SCENARIOS[name]
    assert _outcome(lambda: scenario(fake)) == _outcome(lambda: scenario(real))


def test_a_wrong_api_key_is_refused_the_same(deployments: tuple[str, str, FakeOrchard]) -> None:
    endpoint, _, fake = deployments
    with Orchard(endpoint, "wrong") as real, fake.client(api_key="wrong") as faked:
        assert _outcome(faked.sandboxes.list) == _outcome(real.sandboxes.list)
