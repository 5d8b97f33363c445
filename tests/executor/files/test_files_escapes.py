"""Hostile trees and hostile paths: nothing may leave the sandbox root, nothing may hang.

``sandbox.host`` plays the host; every test checks that its content is untouched
and that what the client got came from inside the root.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from orchard.executor.files import SandboxFiles

from orchard.common.errors import ServiceError

from .conftest import (
    HOST_SECRET,
    SANDBOX_PASSWD,
    Sandbox,
    assert_refused,
    chunks,
    collect,
    run,
)


def read(sandbox: Sandbox, path: str) -> bytes:
    return b"".join(c.data for c in run(collect(sandbox.files.read_file(path))))


def test_dotdot_in_every_api(sandbox: Sandbox) -> None:
    before = sandbox.host_snapshot()
    f = sandbox.files
    for coro in (
        collect(f.read_file("../host/secret")),
        f.write_file("/../host/secret", 0, True, chunks([b"x"])),
        f.upload("../../host", chunks([b""])),
        collect(f.download("/tmp/../../host")),
    ):
        err = assert_refused(coro, grpc.StatusCode.INVALID_ARGUMENT, "PATH_ESCAPE")
        assert "climbs out of the sandbox root" in err.message
    assert sandbox.host_snapshot() == before


def test_absolute_paths_are_sandbox_paths(sandbox: Sandbox) -> None:
    assert read(sandbox, "/etc/passwd") == SANDBOX_PASSWD
    host_path = str(sandbox.secret)  # a host path means nothing inside the sandbox
    assert_refused(
        collect(sandbox.files.read_file(host_path)), grpc.StatusCode.NOT_FOUND, "PATH_NOT_FOUND"
    )


@pytest.mark.parametrize("kind", ["absolute", "relative", "host-absolute"])
def test_final_symlink_resolves_in_root(sandbox: Sandbox, kind: str) -> None:
    link = sandbox.root / "tmp/link"
    target = {
        "absolute": "/etc/passwd",
        "relative": "../../../../../../../../etc/passwd",
        "host-absolute": str(sandbox.secret),
    }[kind]
    link.symlink_to(target)
    if kind == "host-absolute":  # means <root>/<host path> inside: absent
        assert_refused(
            collect(sandbox.files.read_file("/tmp/link")),
            grpc.StatusCode.NOT_FOUND,
            "PATH_NOT_FOUND",
        )
    else:
        assert read(sandbox, "/tmp/link") == SANDBOX_PASSWD


def test_intermediate_directory_symlinks_resolve_in_root(sandbox: Sandbox) -> None:
    (sandbox.root / "tmp/abs").symlink_to("/")
    (sandbox.root / "tmp/rel").symlink_to("../../../../..")
    (sandbox.root / "tmp/hostdir").symlink_to(sandbox.host)
    assert read(sandbox, "/tmp/abs/etc/passwd") == SANDBOX_PASSWD
    assert read(sandbox, "/tmp/rel/etc/passwd") == SANDBOX_PASSWD
    assert_refused(
        collect(sandbox.files.read_file("/tmp/hostdir/secret")),
        grpc.StatusCode.NOT_FOUND,
        "PATH_NOT_FOUND",
    )


def test_writes_through_symlinks_stay_in_root(sandbox: Sandbox) -> None:
    before = sandbox.host_snapshot()
    (sandbox.root / "tmp/hostdir").symlink_to(sandbox.host)
    (sandbox.root / "tmp/up").symlink_to("../../..")
    # A link to a host path means <root>/<host path> to the sandbox: written there.
    mirror = sandbox.root / str(sandbox.host).lstrip("/")
    mirror.mkdir(parents=True)
    run(sandbox.files.write_file("/tmp/hostdir/secret", 0, False, chunks([b"pwned"])))
    assert (mirror / "secret").read_bytes() == b"pwned"
    run(sandbox.files.write_file("/tmp/up/etc/motd", 0, False, chunks([b"hi"])))
    assert (sandbox.root / "etc/motd").read_bytes() == b"hi"
    assert sandbox.host_snapshot() == before


def test_final_symlink_is_replaced_not_written_through(sandbox: Sandbox) -> None:
    before = sandbox.host_snapshot()
    link = sandbox.root / "tmp/link"
    link.symlink_to(sandbox.secret)
    run(sandbox.files.write_file("/tmp/link", 0, False, chunks([b"new"])))
    assert not link.is_symlink()
    assert link.read_bytes() == b"new"
    assert sandbox.host_snapshot() == before


def test_directory_swapped_for_symlink(sandbox: Sandbox) -> None:
    """Between two calls the sandbox replaces a directory by a link to the host."""
    before = sandbox.host_snapshot()
    work = sandbox.root / "work"
    work.mkdir()
    run(sandbox.files.write_file("/work/a", 0, False, chunks([b"1"])))
    (work / "a").unlink()
    work.rmdir()
    work.symlink_to(sandbox.host)
    assert_refused(
        collect(sandbox.files.read_file("/work/secret")),
        grpc.StatusCode.NOT_FOUND,
        "PATH_NOT_FOUND",
    )
    # make_parents does not create the link's target (like mkdir -p): refused.
    assert_refused(
        sandbox.files.write_file("/work/secret", 0, True, chunks([b"x"])),
        grpc.StatusCode.FAILED_PRECONDITION,
        "FILE_EXISTS",
    )
    assert_refused(
        collect(sandbox.files.download("/work")), grpc.StatusCode.NOT_FOUND, "PATH_NOT_FOUND"
    )
    assert sandbox.host_snapshot() == before


def test_fifo_is_refused_without_hanging(sandbox: Sandbox) -> None:
    os.mkfifo(sandbox.root / "tmp/fifo")
    (sandbox.root / "tmp/fifolink").symlink_to("/tmp/fifo")
    for path in ("/tmp/fifo", "/tmp/fifolink"):
        err = assert_refused(
            collect(sandbox.files.read_file(path)),
            grpc.StatusCode.FAILED_PRECONDITION,
            "UNSUPPORTED_FILE_TYPE",
        )
        assert "is a fifo" in err.message
    assert_refused(
        collect(sandbox.files.download("/tmp/fifo")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UNSUPPORTED_FILE_TYPE",
    )


def test_device_node_is_refused_and_never_opened(sandbox: Sandbox) -> None:
    dev = sandbox.root / "dev"
    dev.mkdir()
    try:
        os.mknod(dev / "null", 0o666 | 0o020000, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    err = assert_refused(
        collect(sandbox.files.read_file("/dev/null")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UNSUPPORTED_FILE_TYPE",
    )
    assert "character device" in err.message
    # And a socket, for completeness.
    import socket

    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sandbox.root / "tmp/sock"))
        err = assert_refused(
            collect(sandbox.files.read_file("/tmp/sock")),
            grpc.StatusCode.FAILED_PRECONDITION,
            "UNSUPPORTED_FILE_TYPE",
        )
        assert "socket" in err.message
    finally:
        s.close()


def test_magic_links_are_refused(sandbox: Sandbox) -> None:
    """/proc/<pid>/root and /proc/<pid>/fd/* jump anywhere; RESOLVE_NO_MAGICLINKS stops them.

    A sandbox's own /proc is not visible from the host, so use the host's root
    (and allow crossing into /proc's mount) to exercise the flag itself.
    """
    files = SandboxFiles(Path("/"), same_mount=False)
    for path in ("/proc/self/root/etc/passwd", "/proc/self/cwd", "/proc/self/exe"):
        err = assert_refused(
            collect(files.read_file(path)), grpc.StatusCode.INVALID_ARGUMENT, "PATH_ESCAPE"
        )
        assert path in err.message
    # Same-mount confinement: /proc is another mount than /.
    assert_refused(
        collect(SandboxFiles(Path("/")).read_file("/proc/version")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "PATH_ESCAPE",
    )


def test_make_parents_refuses_dangling_symlink(sandbox: Sandbox) -> None:
    before = sandbox.host_snapshot()
    (sandbox.root / "tmp/dangling").symlink_to(sandbox.host / "newdir")
    err = assert_refused(
        sandbox.files.write_file("/tmp/dangling/f", 0, True, chunks([b"x"])),
        grpc.StatusCode.FAILED_PRECONDITION,
        "FILE_EXISTS",
    )
    assert "/tmp/dangling" in err.message
    assert sandbox.host_snapshot() == before
    assert not (sandbox.host / "newdir").exists()


_names = st.sampled_from(
    ["..", ".", "", "a", "b", "abs", "rel", "host", "loop", "etc", "passwd", "secret"]
)


def _hostile_root(base: Path) -> tuple[Path, Path]:
    host = base / "host"
    host.mkdir()
    (host / "secret").write_bytes(HOST_SECRET)
    root = base / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "passwd").write_bytes(SANDBOX_PASSWD)
    (root / "a" / "abs").symlink_to("/")
    (root / "a" / "rel").symlink_to("../../../..")
    (root / "a" / "b" / "host").symlink_to(host)
    (root / "b").symlink_to(host / "secret")
    (root / "loop").symlink_to("loop")
    return root, host


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_names, min_size=1, max_size=8), st.booleans())
def test_random_paths_never_land_outside_the_root(parts: list[str], absolute: bool) -> None:
    path = ("/" if absolute else "") + "/".join(parts)
    with tempfile.TemporaryDirectory() as tmp:
        root, host = _hostile_root(Path(tmp))
        files = SandboxFiles(root)
        try:
            run(files.write_file(path, 0, True, chunks([b"written"])))
        except ServiceError as err:
            assert err.code != grpc.StatusCode.INTERNAL, err.message
        try:
            data = b"".join(c.data for c in run(collect(files.read_file(path))))
            assert HOST_SECRET not in data
        except ServiceError as err:
            assert err.code != grpc.StatusCode.INTERNAL, err.message
        assert sorted(os.listdir(host)) == ["secret"]
        assert (host / "secret").read_bytes() == HOST_SECRET
        assert sorted(os.listdir(tmp)) == ["host", "root"]
