"""ListDir, Stat, Remove, Rename and MakeDir on a hostile tree: confined like read/write.

``sandbox.host`` plays the host (see conftest); every test that plants links to
it checks the host is untouched. The fuzz at the end drives every new call with
random paths through links to "/", "../..", the host and loops.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from orchard.executor.files import SandboxFiles

from orchard._proto.orchard.v1 import executor_pb2 as pb
from orchard.common.errors import ServiceError

from .conftest import HOST_SECRET, SANDBOX_PASSWD, Sandbox, assert_refused, run
from .test_files_escapes import _hostile_root, _names


def _paths(entries: list[pb.FileStat]) -> list[str]:
    return [e.path for e in entries]


def test_list_dir_reports_types_sizes_modes_and_links(sandbox: Sandbox) -> None:
    root = sandbox.root
    (root / "w/sub/deep").mkdir(parents=True)
    (root / "w/f").write_bytes(b"12345")
    os.chmod(root / "w/f", 0o640)
    (root / "w/link").symlink_to("/etc/passwd")
    os.mkfifo(root / "w/fifo")
    (root / "w/sub/g").write_bytes(b"")
    entries, truncated = run(sandbox.files.list_dir("/w", 1, 0))
    assert not truncated
    by = {e.name: e for e in entries}
    assert sorted(by) == ["f", "fifo", "link", "sub"]
    assert (by["f"].type, by["f"].size, by["f"].mode, by["f"].path) == (
        pb.FILE_TYPE_FILE, 5, 0o640, "/w/f",
    )  # fmt: skip
    assert (by["link"].type, by["link"].symlink_target) == (pb.FILE_TYPE_SYMLINK, "/etc/passwd")
    assert by["fifo"].type == pb.FILE_TYPE_FIFO  # listed, never opened (would block)
    assert by["sub"].type == pb.FILE_TYPE_DIRECTORY and by["f"].mtime > 0
    deep, _ = run(sandbox.files.list_dir("/w", 3, 0))
    assert _paths(deep) == ["/w/f", "/w/fifo", "/w/link", "/w/sub", "/w/sub/deep", "/w/sub/g"]


def test_list_dir_is_bounded(sandbox: Sandbox) -> None:
    for i in range(30):
        (sandbox.root / f"tmp/{i:02d}").write_bytes(b"")
    entries, truncated = run(sandbox.files.list_dir("/tmp", 1, 10))
    assert truncated and len(entries) == 10
    assert_refused(
        sandbox.files.list_dir("/tmp", 65, 0), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD"
    )
    assert_refused(
        sandbox.files.list_dir("/tmp", 1, 100_001),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )


def test_listing_never_follows_links_out(sandbox: Sandbox) -> None:
    """Links to the host, to "/" and to ".." are listed as links and never entered."""
    (sandbox.root / "tmp/hostdir").symlink_to(sandbox.host)
    (sandbox.root / "tmp/up").symlink_to("../../../..")
    (sandbox.root / "tmp/rootlink").symlink_to("/")
    entries, _ = run(sandbox.files.list_dir("/tmp", 10, 0))
    assert _paths(entries) == ["/tmp/hostdir", "/tmp/rootlink", "/tmp/up"]
    assert all(e.type == pb.FILE_TYPE_SYMLINK for e in entries)
    # The named path itself resolves in-root: a link to "/" lists the sandbox's root.
    top, _ = run(sandbox.files.list_dir("/tmp/rootlink", 1, 0))
    assert {"etc", "home", "tmp"} <= {e.name for e in top}
    # ... and a link to a host path means that path inside the sandbox: absent.
    assert_refused(
        sandbox.files.list_dir("/tmp/hostdir", 1, 0), grpc.StatusCode.NOT_FOUND, "PATH_NOT_FOUND"
    )
    assert_refused(
        sandbox.files.list_dir("/etc/passwd", 1, 0),
        grpc.StatusCode.FAILED_PRECONDITION,
        "NOT_A_DIRECTORY",
    )


def test_stat_follows_in_root_or_not_at_all(sandbox: Sandbox) -> None:
    (sandbox.root / "tmp/pw").symlink_to("../../../etc/passwd")
    (sandbox.root / "tmp/hostsecret").symlink_to(sandbox.secret)
    followed = run(sandbox.files.stat("/tmp/pw"))
    assert (followed.type, followed.size) == (pb.FILE_TYPE_FILE, len(SANDBOX_PASSWD))
    assert followed.path == "/tmp/pw"
    link = run(sandbox.files.stat("/tmp/pw", follow=False))
    assert (link.type, link.symlink_target) == (pb.FILE_TYPE_SYMLINK, "../../../etc/passwd")
    assert_refused(
        sandbox.files.stat("/tmp/hostsecret"), grpc.StatusCode.NOT_FOUND, "PATH_NOT_FOUND"
    )
    assert_refused(sandbox.files.stat("/../host"), grpc.StatusCode.INVALID_ARGUMENT, "PATH_ESCAPE")


def test_magic_links_refused_by_stat_and_list() -> None:
    files = SandboxFiles(Path("/"), same_mount=False)
    for coro in (files.stat("/proc/self/root/etc"), files.list_dir("/proc/self/root", 1, 0)):
        assert_refused(coro, grpc.StatusCode.INVALID_ARGUMENT, "PATH_ESCAPE")


def test_remove_removes_links_not_targets(sandbox: Sandbox) -> None:
    before = sandbox.host_snapshot()
    (sandbox.root / "tmp/hostdir").symlink_to(sandbox.host)
    (sandbox.root / "tmp/hostsecret").symlink_to(sandbox.secret)
    assert run(sandbox.files.remove("/tmp/hostsecret", False)) == 1
    # A tree holding a link to the host: the link goes, the host stays.
    tree = sandbox.root / "tree/a/b"
    tree.mkdir(parents=True)
    (tree / "f").write_bytes(b"x")
    (tree / "up").symlink_to(sandbox.host)
    (sandbox.root / "tree/a/abs").symlink_to("/")
    assert run(sandbox.files.remove("/tree", True)) == 6
    assert not (sandbox.root / "tree").exists()
    assert run(sandbox.files.remove("/tmp/hostdir", True)) == 1  # the link, not its target
    assert sandbox.host_snapshot() == before
    assert (sandbox.root / "etc/passwd").read_bytes() == SANDBOX_PASSWD


def test_remove_refusals(sandbox: Sandbox) -> None:
    (sandbox.root / "tmp/d").mkdir()
    (sandbox.root / "tmp/d/f").write_bytes(b"")
    err = assert_refused(
        sandbox.files.remove("/tmp/d", False), grpc.StatusCode.FAILED_PRECONDITION, "IS_A_DIRECTORY"
    )
    assert "not empty" in err.message
    assert_refused(
        sandbox.files.remove("/", True), grpc.StatusCode.FAILED_PRECONDITION, "IS_A_DIRECTORY"
    )
    assert_refused(sandbox.files.remove("/nope", True), grpc.StatusCode.NOT_FOUND, "PATH_NOT_FOUND")
    assert_refused(
        sandbox.files.remove("/tmp/../../host/secret", True),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_ESCAPE",
    )
    assert sandbox.secret.read_bytes() == HOST_SECRET


def test_remove_through_a_parent_link_to_the_host_stays_in_root(sandbox: Sandbox) -> None:
    (sandbox.root / "tmp/hostdir").symlink_to(sandbox.host)
    assert_refused(
        sandbox.files.remove("/tmp/hostdir/secret", False),
        grpc.StatusCode.NOT_FOUND,
        "PATH_NOT_FOUND",
    )
    assert sandbox.secret.read_bytes() == HOST_SECRET


def test_remove_races_a_sandbox_that_swaps_dirs_for_host_links(sandbox: Sandbox) -> None:
    """While a tree is removed, the sandbox keeps replacing its directories by links to
    the host; the host must survive whatever interleaving happens."""
    before = sandbox.host_snapshot()
    stop = threading.Event()
    base = sandbox.root / "race"

    def swapper() -> None:
        while not stop.is_set():
            for i in range(20):
                d = base / f"d{i}"
                try:
                    if d.is_symlink():
                        d.unlink()
                        d.mkdir()
                        (d / "f").write_bytes(b"x")
                    else:
                        os.rename(d, base / f"old{i}")
                        d.symlink_to(sandbox.host)
                except OSError:
                    pass

    for round_ in range(5):
        shutil.rmtree(base, ignore_errors=True)  # the test's own reset (never through links)
        for i in range(20):
            (base / f"d{i}/sub").mkdir(parents=True, exist_ok=True)
            (base / f"d{i}/sub/f").write_bytes(b"x")
        thread = threading.Thread(target=swapper)
        thread.start()
        try:
            run(sandbox.files.remove("/race", True))
        except ServiceError as err:
            assert err.code != grpc.StatusCode.INTERNAL, err.message
        finally:
            stop.set()
            thread.join()
            stop.clear()
        assert sandbox.host_snapshot() == before, round_


def test_rename_moves_entries_not_link_targets(sandbox: Sandbox) -> None:
    before = sandbox.host_snapshot()
    (sandbox.root / "tmp/hostsecret").symlink_to(sandbox.secret)
    (sandbox.root / "tmp/a").write_bytes(b"a")
    run(sandbox.files.rename("/tmp/a", "/home/agent/b"))
    assert (sandbox.root / "home/agent/b").read_bytes() == b"a"
    run(sandbox.files.rename("/tmp/hostsecret", "/tmp/moved"))  # the link itself moves
    assert os.readlink(sandbox.root / "tmp/moved") == str(sandbox.secret)
    # Replacing a link with a file replaces the link, never writes through it.
    (sandbox.root / "tmp/n").write_bytes(b"new")
    run(sandbox.files.rename("/tmp/n", "/tmp/moved"))
    assert (sandbox.root / "tmp/moved").read_bytes() == b"new"
    # A destination through a parent link to the host lands inside the root (or nowhere).
    (sandbox.root / "tmp/hostdir").symlink_to(sandbox.host)
    (sandbox.root / "tmp/c").write_bytes(b"c")
    assert_refused(
        sandbox.files.rename("/tmp/c", "/tmp/hostdir/secret"),
        grpc.StatusCode.NOT_FOUND,
        "PATH_NOT_FOUND",
    )
    assert_refused(
        sandbox.files.rename("/tmp/c", "/../host/secret"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_ESCAPE",
    )
    assert_refused(
        sandbox.files.rename("/tmp", "/tmp/inside"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )
    assert_refused(
        sandbox.files.rename("/", "/x"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "ERROR_REASON_UNSPECIFIED",
    )
    assert sandbox.host_snapshot() == before


def test_make_dir(sandbox: Sandbox) -> None:
    assert run(sandbox.files.make_dir("/a/b/c", True, 0o700))
    assert not run(sandbox.files.make_dir("/a/b/c", True, 0))
    assert (os.stat(sandbox.root / "a/b/c").st_mode & 0o7777) == 0o700
    assert (os.stat(sandbox.root / "a/b").st_mode & 0o7777) == 0o755
    assert_refused(
        sandbox.files.make_dir("/x/y", False, 0), grpc.StatusCode.NOT_FOUND, "PATH_NOT_FOUND"
    )
    assert_refused(
        sandbox.files.make_dir("/etc/passwd", True, 0),
        grpc.StatusCode.FAILED_PRECONDITION,
        "FILE_EXISTS",
    )
    assert_refused(
        sandbox.files.make_dir("/etc/passwd/x", True, 0),
        grpc.StatusCode.FAILED_PRECONDITION,
        "NOT_A_DIRECTORY",
    )
    assert_refused(
        sandbox.files.make_dir("/m", True, 0o10000),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )


def test_make_dir_never_creates_through_a_link_to_the_host(sandbox: Sandbox) -> None:
    before = sandbox.host_snapshot()
    (sandbox.root / "tmp/dangling").symlink_to(sandbox.host / "newdir")
    (sandbox.root / "tmp/hostdir").symlink_to(sandbox.host)
    assert_refused(
        sandbox.files.make_dir("/tmp/dangling", True, 0),
        grpc.StatusCode.FAILED_PRECONDITION,
        "FILE_EXISTS",
    )
    assert_refused(
        sandbox.files.make_dir("/tmp/dangling/sub", True, 0),
        grpc.StatusCode.FAILED_PRECONDITION,
        "FILE_EXISTS",
    )
    # hostdir -> <host path> dangles in-root: mkdir -p does not create its target.
    assert_refused(
        sandbox.files.make_dir("/tmp/hostdir/inside", True, 0),
        grpc.StatusCode.FAILED_PRECONDITION,
        "FILE_EXISTS",
    )
    assert sandbox.host_snapshot() == before
    assert not (sandbox.host / "newdir").exists() and not (sandbox.host / "inside").exists()


_OPS = st.sampled_from(["list", "stat", "lstat", "remove", "rmtree", "rename", "mkdir"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    _OPS,
    st.lists(_names, min_size=1, max_size=6),
    st.lists(_names, min_size=1, max_size=6),
    st.booleans(),
)
def test_random_paths_never_leave_the_root(
    op: str, parts: list[str], other: list[str], absolute: bool
) -> None:
    path = ("/" if absolute else "") + "/".join(parts)
    dest = "/" + "/".join(other)
    with tempfile.TemporaryDirectory() as tmp:
        root, host = _hostile_root(Path(tmp))
        files = SandboxFiles(root)
        calls = {
            "list": lambda: files.list_dir(path, 8, 0),
            "stat": lambda: files.stat(path),
            "lstat": lambda: files.stat(path, follow=False),
            "remove": lambda: files.remove(path, False),
            "rmtree": lambda: files.remove(path, True),
            "rename": lambda: files.rename(path, dest),
            "mkdir": lambda: files.make_dir(path, True, 0),
        }
        try:
            result = run(calls[op]())
        except ServiceError as err:
            assert err.code != grpc.StatusCode.INTERNAL, err.message
        else:
            if op == "list":
                entries, _ = result  # type: ignore[misc]
                assert all(str(host) not in e.path for e in entries)
        assert sorted(os.listdir(host)) == ["secret"]
        assert (host / "secret").read_bytes() == HOST_SECRET
        assert sorted(os.listdir(tmp)) == ["host", "root"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_named_owner_on_write_upload_and_mkdir(sandbox: Sandbox) -> None:
    base = (1 << 30) + 3 * 65536
    files = SandboxFiles(sandbox.root, owner=base)
    from . import tarbuild
    from .conftest import chunks

    run(files.write_file("/home/agent/new/f", 0o600, True, chunks([b"x"]), owner="agent"))
    for rel in ("home/agent/new", "home/agent/new/f"):
        st_ = os.lstat(sandbox.root / rel)
        assert (st_.st_uid, st_.st_gid) == (base + 1000, base + 1000), rel
    assert os.stat(sandbox.root / "home/agent/new/f").st_mode & 0o7777 == 0o600
    # A replaced file takes the named owner (without one it keeps its old owner).
    run(files.write_file("/home/agent/new/f", 0, False, chunks([b"y"]), owner="0:1000"))
    st_ = os.lstat(sandbox.root / "home/agent/new/f")
    assert (st_.st_uid, st_.st_gid) == (base, base + 1000)
    data = tarbuild.build([tarbuild.Member("d/g", data=b"z")])
    run(files.upload("/up", chunks(tarbuild.split(data)), owner="1000"))
    for rel in ("up/d", "up/d/g"):
        st_ = os.lstat(sandbox.root / rel)
        assert (st_.st_uid, st_.st_gid) == (base + 1000, base + 1000), rel
    assert run(files.make_dir("/m/n", True, 0, owner="agent"))
    assert os.lstat(sandbox.root / "m/n").st_uid == base + 1000
    # The sandbox sees its own ids back.
    assert run(files.stat("/m/n")).uid == 1000
    assert_refused(
        files.write_file("/x", 0, False, chunks([b""]), owner="nobody-here"),
        grpc.StatusCode.NOT_FOUND,
        "USER_NOT_FOUND",
    )
    assert_refused(
        files.make_dir("/x", True, 0, owner="70000"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
    )


def test_magic_links_refused_by_every_mutating_call(tmp_path: Path) -> None:
    """/proc/self/root jumps to the host's "/": remove, rename and mkdir through it are
    refused at lookup (RESOLVE_NO_MAGICLINKS), so the host file stays."""
    victim = Path(tempfile.mkdtemp(prefix="oe-magic-", dir="/tmp"))
    try:
        (victim / "keep").write_bytes(b"host")
        via = f"/proc/self/root{victim}"
        files = SandboxFiles(Path("/"), same_mount=False)
        for coro in (
            files.remove(f"{via}/keep", False),
            files.remove(via, True),
            files.rename(f"{via}/keep", f"{via}/moved"),
            files.make_dir(f"{via}/new", True, 0),
            files.list_dir(via, 1, 0),
        ):
            assert_refused(coro, grpc.StatusCode.INVALID_ARGUMENT, "PATH_ESCAPE")
        assert sorted(os.listdir(victim)) == ["keep"]
        assert (victim / "keep").read_bytes() == b"host"
    finally:
        shutil.rmtree(victim)


def test_listing_races_a_sandbox_that_swaps_dirs_for_host_links(sandbox: Sandbox) -> None:
    """A deep listing while directories become links to the host and back: it never
    reports (or enters) anything of the host."""
    stop = threading.Event()
    base = sandbox.root / "race"
    for i in range(20):
        (base / f"d{i}/sub").mkdir(parents=True)
        (base / f"d{i}/sub/f").write_bytes(b"x")

    def swapper() -> None:
        while not stop.is_set():
            for i in range(20):
                d = base / f"d{i}"
                try:
                    if d.is_symlink():
                        d.unlink()
                        os.rename(base / f"keep{i}", d)
                    else:
                        os.rename(d, base / f"keep{i}")
                        d.symlink_to(sandbox.host)
                except OSError:
                    pass

    thread = threading.Thread(target=swapper)
    thread.start()
    try:
        for _ in range(30):
            entries, _ = run(sandbox.files.list_dir("/race", 5, 0))
            names = {e.name for e in entries}
            assert "secret" not in names, "a listing went through a link to the host"
    finally:
        stop.set()
        thread.join()
