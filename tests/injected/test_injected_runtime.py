"""What only the injected runtime has to prove, on both images.

The executor runs from the read-only bundle inside the sandbox (nothing of the
image is used: the busybox image has no libc and no Python), the image's
layers stay byte-identical, the bundle cannot be written, the token key is
gone before any command runs, only root reaches init's socket, files and
tokens work through the injected executor, and oom_killed is seen from inside.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from orchard.scheduler.backends.base import BackendError, SandboxSpec
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.images import ImageStore, normalize_image_name
from orchard.scheduler.backends.local.settings import LocalSettings

from orchard._proto.orchard.v1 import executor_pb2 as pb
from tests.executor.files.tarbuild import Member, build
from tests.executor.harness import Client, error_reason

from .conftest import InjectedNode
from .sandbox_pids import SandboxPids

pytestmark = pytest.mark.runc

SUITE_ID = "sb-exec-test"
OTHER_ID = "sb-exec-other"
PROCS = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


def tree_snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root``: type and mode bits, owner, size, mtime, content hash or link."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.islink(path):
                detail: object = os.readlink(path)
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    detail = hashlib.file_digest(f, "sha256").hexdigest()
            else:
                detail = None
            out[os.path.relpath(path, root)] = (
                st.st_mode,
                st.st_uid,
                st.st_gid,
                st.st_size if not os.path.isdir(path) else 0,
                st.st_mtime_ns,
                detail,
            )
    return out


@pytest.fixture(scope="module", autouse=True)
def layers_before(
    node: InjectedNode, images_dir: Path, bundle: Path
) -> Iterator[tuple[Path, dict[str, tuple[object, ...]], dict[str, tuple[object, ...]]]]:
    """The image folder and the bundle, snapshotted before any sandbox of the module exists."""
    folder = ImageStore(images_dir).folder_of(normalize_image_name(node.image))
    yield folder, tree_snapshot(folder), tree_snapshot(bundle)


def test_the_executor_runs_from_the_bundle_not_the_image(
    node: InjectedNode, client: Client, image: str
) -> None:
    procs = client.run(SUITE_ID, shell=PROCS).stdout.decode()
    assert "/.orchard/bundle/bin/orchard-init --listen-fd 3" in procs
    assert (
        "/.orchard/bundle/lib/ld-linux-x86-64.so.2 --library-path /.orchard/bundle/lib "
        "/.orchard/bundle/bin/python3 -B -s -m orchard.executor --in-sandbox /.orchard/run"
    ) in procs
    if image == "busybox":
        probe = client.run(
            SUITE_ID,
            shell="ls /lib /lib64 /usr/lib 2>&1; command -v python3 bash || echo no-python-no-bash",
        )
        assert b"No such file or directory" in probe.stdout
        assert probe.stdout.endswith(b"no-python-no-bash\n")
    # The executor is non-dumpable: sandbox code cannot read its memory map ...
    [(host_pid, ns_pid)] = SandboxPids(node.init_pid(SUITE_ID)).find(
        b"orchard.executor\0--in-sandbox"
    )
    inside = client.run(SUITE_ID, shell=f"cat /proc/{ns_pid}/maps")
    assert inside.stdout == b""
    # ... the host can: every file it maps (libc, libpython, ...) is the bundle's.
    with open(f"/proc/{host_pid}/maps") as f:
        files = {line.split()[-1] for line in f if len(line.split()) == 6}
    files = {name for name in files if name.startswith("/") and not name.startswith("/dev/")}
    assert any(name.endswith("/libc.so.6") for name in files), files
    assert [n for n in files if not n.startswith("/.orchard/bundle/")] == []


def test_bundle_is_read_only_and_the_key_is_gone(client: Client) -> None:
    r = client.run(SUITE_ID, shell="touch /.orchard/bundle/x; echo $?; ls -a /.orchard/run")
    lines = r.stdout.decode().split()
    assert lines[0] != "0" and b"Read-only file system" in r.stderr
    assert "token.key" not in lines and "executor.sock" in lines and "init.sock" in lines
    as_alice = client.run(SUITE_ID, shell="ls /.orchard/run", user="alice")
    assert as_alice.status.exit_code != 0 and b"Permission denied" in as_alice.stderr


def test_start_failures_look_like_a_shell(client: Client) -> None:
    r = client.run(SUITE_ID, argv=["no-such-command-xyz"])
    assert r.status.exit_code == 127 and b"no-such-command-xyz: command not found" in r.stderr
    client.run(SUITE_ID, shell="echo 'echo hi' > /tmp/plain-file; chmod 644 /tmp/plain-file")
    r = client.run(SUITE_ID, argv=["/tmp/plain-file"])
    assert r.status.exit_code == 126 and b"Permission denied" in r.stderr
    r = client.run(SUITE_ID, argv=["true"], cwd="/no/such/dir")
    assert r.status.exit_code == 126
    assert b"cannot change directory to /no/such/dir: No such file or directory" in r.stderr


def _run(client: Client, sandbox_id: str, token: str) -> pb.RunResponse:
    request = pb.RunRequest(start=pb.ExecStart(sandbox_id=sandbox_id, argv=["true"]))
    response: pb.RunResponse = client.stub.Run(
        request, metadata=client.metadata(sandbox_id, token), timeout=10
    )
    return response


def test_each_executor_serves_only_its_own_sandbox(client: Client, other_client: Client) -> None:
    foreign, _ = client.signer.issue(OTHER_ID, 3600)
    with pytest.raises(grpc.RpcError) as err:
        _run(client, SUITE_ID, foreign)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # The other sandbox's id with its own valid token: this executor holds only its own
    # sandbox's token keys, so it cannot even verify it (issue 12: per-sandbox keys).
    with pytest.raises(grpc.RpcError) as err:
        _run(client, OTHER_ID, foreign)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_reason(err.value) == "TOKEN_INVALID"
    assert _run(other_client, OTHER_ID, foreign).status.exit_code == 0


def test_files_through_the_injected_executor(client: Client) -> None:
    data = os.urandom(3 << 20)
    md = client.metadata(SUITE_ID)

    def writes() -> Iterator[pb.WriteFileRequest]:
        yield pb.WriteFileRequest(
            header=pb.WriteFileHeader(sandbox_id=SUITE_ID, path="/work/a/blob", make_parents=True)
        )
        for i in range(0, len(data), 1 << 20):
            yield pb.WriteFileRequest(data=data[i : i + (1 << 20)])
        yield pb.WriteFileRequest(end=pb.WriteFileEnd(size=len(data)))

    assert client.stub.WriteFile(writes(), metadata=md).size == len(data)
    r = client.run(SUITE_ID, shell="sha256sum /work/a/blob")
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    chunks = client.stub.ReadFile(
        pb.ReadFileRequest(sandbox_id=SUITE_ID, path="/work/a/blob"), metadata=md
    )
    assert b"".join(c.data for c in chunks) == data

    tar = build([Member("d/x.txt", data=b"x\n"), Member("d/y.txt", data=b"y\n")])
    uploads = iter(
        [
            pb.UploadRequest(header=pb.UploadHeader(sandbox_id=SUITE_ID, path="/work/up")),
            pb.UploadRequest(data=tar),
        ]
    )
    assert client.stub.Upload(uploads, metadata=md).files == 2
    assert client.run(SUITE_ID, shell="cat /work/up/d/x.txt /work/up/d/y.txt").stdout == b"x\ny\n"
    down = client.stub.Download(
        pb.DownloadRequest(sandbox_id=SUITE_ID, path="/work/up"), metadata=md
    )
    with tarfile.open(fileobj=io.BytesIO(b"".join(c.data for c in down))) as archive:
        names = sorted(m.name for m in archive.getmembers() if m.isreg())
    assert [n.rsplit("/", 2)[-2:] for n in names] == [["d", "x.txt"], ["d", "y.txt"]]
    # The file API never crosses a mount point (RESOLVE_NO_XDEV): with root "/"
    # that keeps it out of the bundle, the run folder, /proc and /sys.
    with pytest.raises(grpc.RpcError) as err:
        client.stub.WriteFile(
            iter(
                [
                    pb.WriteFileRequest(
                        header=pb.WriteFileHeader(sandbox_id=SUITE_ID, path="/.orchard/bundle/x")
                    ),
                    pb.WriteFileRequest(data=b"no"),
                    pb.WriteFileRequest(end=pb.WriteFileEnd(size=2)),
                ]
            ),
            metadata=md,
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "across a mount point" in (err.value.details() or "")


def test_oom_killed_is_seen_from_inside(node: InjectedNode) -> None:
    sandbox_id = "sb-inj-oom"
    c = Client(node.create(sandbox_id, memory_bytes=192 << 20), node.home)
    try:
        r = c.run(sandbox_id, argv=["tail", "/dev/zero"], timeout=60)
        assert r.status.signal == 9 and r.status.oom_killed, r
        assert c.run(sandbox_id, argv=["true"]).status.exit_code == 0  # the executor survived
    finally:
        c.close()
        node.delete(sandbox_id)


def test_missing_bundle_is_a_clear_create_failure(node: InjectedNode, tmp_path: Path) -> None:
    settings = LocalSettings(
        home=node.home,
        images_dir=node.backend.settings.images_dir,
        init_binary=node.backend.settings.init_binary,
        executor_bundle=tmp_path / "no-bundle",
    )
    backend = LocalBackend(settings)
    try:
        with pytest.raises(BackendError, match=r"executor bundle .* is missing"):
            node.loop.run_until_complete(
                backend.create(SandboxSpec(sandbox_id="sb-inj-nobundle", image=node.image))
            )
        assert not (node.home / "sandboxes" / "sb-inj-nobundle").exists()
    finally:
        node.loop.run_until_complete(backend.close())


def test_image_layers_and_bundle_are_untouched(
    node: InjectedNode,
    bundle: Path,
    layers_before: tuple[Path, dict[str, tuple[object, ...]], dict[str, tuple[object, ...]]],
) -> None:
    """Last: a sandbox that tries to wreck everything it sees; then compare byte for byte."""
    folder, image_before, bundle_before = layers_before
    sandbox_id = "sb-inj-wreck"
    c = Client(node.create(sandbox_id), node.home)
    try:
        refused = c.run(sandbox_id, shell="echo x > /.orchard/bundle/lib/libc.so.6")
        assert refused.status.exit_code != 0 and b"Read-only" in refused.stderr
        c.run(
            sandbox_id,
            shell="echo x > /etc/passwd; chmod 000 /etc; rm -rf /usr /sbin /tmp /root; rm -rf /bin",
        )
        assert c.run(sandbox_id, argv=["/bin/busybox", "true"]).status.exit_code == 127
    finally:
        c.close()
        node.delete(sandbox_id)
    assert tree_snapshot(folder) == image_before
    assert tree_snapshot(bundle) == bundle_before
