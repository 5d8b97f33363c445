"""An injected (runc) sandbox's run folder and files under its user namespace (issue 12).

``test_injected_userns.py`` attacks a stack (root, init and the executor are the
range's uid; the inotify exhaustion). Here, on a node (the local backend, the
executor inside reached on its socket): what the sandbox's root creates is the
range's on the host's disk too, not host uid 0; the run folder and init's socket
belong to that root alone; ``ORCHARD_USERNS=1`` takes injected creates and still
refuses runsc.

And the run folder is the sandbox's now (its root owns it), so the host must not
trust what is in it: a warm-pool claim's ``update_env`` rewrote ``run/sandbox.json``
through a temp name the sandbox could have planted as a symlink to a host file
(the host wrote JSON over that file), and read the old copy back first (a FIFO
there hung a backend worker thread for good). Both attacks here. And run/ was a
folder on the home's filesystem, uncapped: the sandbox's root wrote there past its
writable layer's cap onto the host's disk. It is a small tmpfs now (``run_folder.py``):
a fill ends in ENOSPC, what is written is charged to the sandbox's memory, and delete
(after a failed create, after a crash) unmounts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from orchard.scheduler.backends.base import BackendError, SandboxSpec
from orchard.scheduler.backends.local import injected, run_folder
from orchard.scheduler.backends.local.backend import LocalBackend

from orchard.common.layout import SandboxMeta
from tests.executor.conftest import SANDBOX_ID
from tests.executor.harness import Client
from tests.runtime.runtime_helpers import force_cleanup_home, mounts_under

from .conftest import InjectedNode

pytestmark = [pytest.mark.runc, pytest.mark.reliability]

UPDATE_SECONDS = 10.0
RUN_FILL_MIB = 64


@pytest.fixture(scope="module")
def image() -> str:
    """One image (Debian): what is checked here is the host side of the sandbox."""
    return "debian"


def _uid_map(client: Client, sandbox_id: str) -> tuple[int, int, int]:
    line = client.run(sandbox_id, shell="cat /proc/self/uid_map").stdout.split()
    inside, host, size = (int(x) for x in line)
    return inside, host, size


def _host_base(client: Client, sandbox_id: str) -> int:
    """The host uid of the sandbox's root, checked to be an unprivileged range's first."""
    inside, host, size = _uid_map(client, sandbox_id)
    assert inside == 0 and size == 65536 and host >= 65536, (inside, host, size)
    return host


def test_files_root_creates_are_not_host_root_files(node: InjectedNode, client: Client) -> None:
    r = client.run(SANDBOX_ID, shell="echo x > /tmp/by-root && stat -c %u:%g /tmp/by-root")
    assert r.stdout.strip() == b"0:0", r
    on_disk = node.backend.layout.sandbox(SANDBOX_ID).rootfs / "tmp/by-root"
    st = os.stat(on_disk)
    assert st.st_uid != 0 and st.st_gid != 0, "sandbox root's file is a host-root file"
    host = _host_base(client, SANDBOX_ID)
    assert (st.st_uid, st.st_gid) == (host, host)
    # The image's files are still the image's owners inside (idmapped layers).
    assert client.run(SANDBOX_ID, shell="stat -c %u /etc/passwd").stdout.strip() == b"0"


def test_run_folder_belongs_to_its_own_sandbox_only(node: InjectedNode, client: Client) -> None:
    host = _host_base(client, SANDBOX_ID)
    sandbox = node.backend.layout.sandbox(SANDBOX_ID)
    run = os.stat(injected.run_dir(sandbox))
    # Only this sandbox's root reaches its socket, and no other sandbox's uids
    # (their ranges are other host uids) can even search the folder.
    assert run.st_uid == host and stat.S_IMODE(run.st_mode) == 0o700
    init_sock = os.stat(injected.run_dir(sandbox) / injected.INIT_SOCKET)
    assert init_sock.st_uid == host and stat.S_IMODE(init_sock.st_mode) == 0o600
    assert not (injected.run_dir(sandbox) / injected.TOKEN_KEY_FILE).exists()
    r = client.run(
        SANDBOX_ID, shell="ls /.orchard/run && cat /.orchard/run/sandbox.json >/dev/null"
    )
    assert r.status.exit_code == 0, r
    # The host scheduler still reaches the executor's socket (it is what serves here),
    # and a new env written from the host is still readable inside.
    node.loop.run_until_complete(node.backend.update_env(SANDBOX_ID, {"OE_USERNS_PROBE": "yes"}))
    meta = os.stat(injected.run_dir(sandbox) / injected.META_FILE)
    assert meta.st_uid == host
    assert client.run(SANDBOX_ID, shell="echo $OE_USERNS_PROBE").stdout == b"yes\n"


@pytest.fixture
def required_node(node: InjectedNode) -> Iterator[InjectedNode]:
    """A second backend on the same images and bundle with ORCHARD_USERNS=1."""
    home = Path(tempfile.mkdtemp(prefix="oe-inj-req-", dir="/tmp"))
    settings = replace(node.backend.settings, home=home, userns=True, userns_required=True)
    backend = LocalBackend(settings)
    made = InjectedNode(home, backend, node.loop, node.image)
    try:
        yield made
    finally:
        for sandbox in node.loop.run_until_complete(backend.list()):
            node.loop.run_until_complete(backend.delete(sandbox.sandbox_id))
        node.loop.run_until_complete(backend.close())
        force_cleanup_home(home)


def test_required_user_namespaces_take_injected_and_refuse_runsc(
    required_node: InjectedNode,
) -> None:
    backend, loop = required_node.backend, required_node.loop
    spec = SandboxSpec(sandbox_id="sb-inj-req", image=required_node.image, runtime_class="injected")
    loop.run_until_complete(backend.create(spec))
    c = Client(required_node.address("sb-inj-req"), required_node.home)
    try:
        inside, host, _ = _uid_map(c, "sb-inj-req")
        assert inside == 0 and host >= 65536
    finally:
        c.close()
        required_node.delete("sb-inj-req")
    with pytest.raises(BackendError) as refused:
        loop.run_until_complete(
            backend.create(replace(spec, sandbox_id="sb-inj-req-g", runtime_class="runsc"))
        )
    assert refused.value.reason == "UNSUPPORTED"
    assert "ORCHARD_USERNS=1" in refused.value.message
    assert not (required_node.home / "sandboxes/sb-inj-req-g").exists()


@pytest.fixture
def own(node: InjectedNode) -> Iterator[tuple[str, Client]]:
    """A sandbox of the test's own (the attacks leave its run folder in a mess)."""
    sandbox_id = "sb-inj-run-attack"
    c = Client(node.create(sandbox_id), node.home)
    try:
        yield sandbox_id, c
    finally:
        c.close()
        node.delete(sandbox_id)


def test_update_env_does_not_follow_a_symlink_the_sandbox_planted(
    node: InjectedNode, own: tuple[str, Client], tmp_path: Path
) -> None:
    sandbox_id, client = own
    victim = tmp_path / "host-file"
    victim.write_text("the host's own\n")
    run = "/.orchard/run"
    planted = client.run(sandbox_id, shell=f"ln -sf {victim} {run}/sandbox.tmp && ls -l {run}")
    assert planted.status.exit_code == 0, planted
    with contextlib.suppress(BackendError, OSError):
        node.loop.run_until_complete(node.backend.update_env(sandbox_id, {"OE_CLAIM": "one"}))
    assert victim.read_text() == "the host's own\n", "the host wrote through the sandbox's symlink"
    assert stat.S_ISREG(os.lstat(victim).st_mode)
    # The claim still takes: the executor starts commands with the new env.
    node.loop.run_until_complete(node.backend.update_env(sandbox_id, {"OE_CLAIM": "two"}))
    assert client.run(sandbox_id, shell="echo $OE_CLAIM").stdout == b"two\n"


def test_update_env_does_not_read_a_fifo_the_sandbox_planted(
    node: InjectedNode, own: tuple[str, Client]
) -> None:
    sandbox_id, client = own
    run = "/.orchard/run"
    # One command: the executor reads sandbox.json at each lookup, so after this only
    # the host's rewrite makes the sandbox usable again.
    planted = client.run(sandbox_id, shell=f"rm -f {run}/sandbox.json && mkfifo {run}/sandbox.json")
    assert planted.status.exit_code == 0, planted
    fifo = injected.run_dir(node.backend.layout.sandbox(sandbox_id)) / injected.META_FILE
    update = node.backend.update_env(sandbox_id, {"OE_CLAIM": "three"})
    try:
        node.loop.run_until_complete(asyncio.wait_for(update, UPDATE_SECONDS))
    except TimeoutError:
        # Unstick the worker thread blocked in open(), so the node can still close.
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"update_env blocked on the sandbox's FIFO for {UPDATE_SECONDS} s")
    assert client.run(sandbox_id, shell="echo $OE_CLAIM").stdout == b"three\n"


def _fstype(path: Path) -> str | None:
    """The filesystem type mounted at ``path`` in this mount namespace, None if none is."""
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        for line in mountinfo:
            mount, _, rest = line.partition(" - ")
            if mount.split(" ")[4] == str(path):
                found = rest.split(" ")[0]  # the last one mounted there is what is seen
    return found


def test_the_run_folder_is_not_an_uncapped_way_onto_the_hosts_disk(
    node: InjectedNode, own: tuple[str, Client]
) -> None:
    sandbox_id, client = own
    run = injected.run_dir(node.backend.layout.sandbox(sandbox_id))
    disk_before = os.statvfs(node.home).f_bfree
    r = client.run(
        sandbox_id,
        shell=f"dd if=/dev/zero of=/.orchard/run/fill bs=1M count={RUN_FILL_MIB} 2>&1; "
        "echo rc=$?; stat -c %s /.orchard/run/fill",
    )
    # The sandbox's own writable layer is capped (a tmpfs of sandbox_disk_bytes); the run
    # folder holds two sockets, a key and two small files and holds no more than its cap.
    assert b"No space left" in r.stdout and b"rc=0" not in r.stdout, r
    written = int(r.stdout.split()[-1])
    assert 0 < written <= run_folder.SIZE_BYTES, written
    # Nothing of it is on the host's disk: the host sees the same file on a tmpfs.
    assert _fstype(run) == "tmpfs"
    assert os.stat(run / "fill").st_size == written
    assert disk_before - os.statvfs(node.home).f_bfree < (RUN_FILL_MIB << 20) // 4096 // 2
    # Files are capped too, and the sandbox still serves (its socket is in the folder).
    r = client.run(
        sandbox_id,
        shell="rm -f /.orchard/run/fill; i=0; while touch /.orchard/run/f$i 2>/dev/null; "
        "do i=$((i+1)); done; echo $i; rm -f /.orchard/run/f*",
    )
    assert 0 < int(r.stdout) < run_folder.INODES, r
    assert client.run(sandbox_id, shell="echo still").stdout == b"still\n"


def test_what_the_sandbox_writes_in_its_run_folder_is_charged_to_its_memory(
    node: InjectedNode, own: tuple[str, Client]
) -> None:
    sandbox_id, client = own
    sandbox = node.backend.layout.sandbox(sandbox_id)
    memory = Path(SandboxMeta.from_json(sandbox.meta_file.read_text()).memory_cgroup)
    stat_file = memory / "memory.stat"

    def shmem() -> int:
        for line in stat_file.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key in ("shmem", "total_shmem"):
                return int(value)
        raise AssertionError(f"no shmem in {stat_file}")

    before = shmem()
    r = client.run(sandbox_id, shell="dd if=/dev/zero of=/.orchard/run/fill bs=1M count=2")
    assert r.status.exit_code == 0, r
    try:
        assert shmem() - before >= 2 << 20, (before, shmem())
    finally:
        client.run(sandbox_id, shell="rm -f /.orchard/run/fill")


@pytest.fixture
def fresh_node(node: InjectedNode) -> Iterator[InjectedNode]:
    """A second backend on the same images and bundle, in a home of its own."""
    home = Path(tempfile.mkdtemp(prefix="oe-inj-run-", dir="/tmp"))
    backend = LocalBackend(replace(node.backend.settings, home=home))
    try:
        yield InjectedNode(home, backend, node.loop, node.image)
    finally:
        node.loop.run_until_complete(backend.close())
        force_cleanup_home(home)


def test_a_create_that_fails_after_the_run_folder_leaves_no_mount(
    fresh_node: InjectedNode,
) -> None:
    """The run folder is mounted before the keys go in; a create that fails later (here
    the executor gets no time to serve) is undone by delete, which must unmount it, or
    the sandbox folder cannot be removed."""
    backend, loop = fresh_node.backend, fresh_node.loop
    backend.settings = replace(backend.settings, executor_start_timeout=0.0)
    spec = SandboxSpec(
        sandbox_id="sb-inj-run-fail", image=fresh_node.image, runtime_class="injected"
    )
    with pytest.raises(BackendError):
        loop.run_until_complete(backend.create(spec))
    folder = fresh_node.home / "sandboxes" / spec.sandbox_id
    assert not mounts_under(folder), mounts_under(folder)
    assert not folder.exists()


def test_delete_after_a_crash_removes_the_mounted_run_folder(fresh_node: InjectedNode) -> None:
    """A scheduler killed right after mounting run/ left the mount and its keys; a new
    backend on the home (what a restarted scheduler starts) deletes it, mount and all."""
    backend, loop = fresh_node.backend, fresh_node.loop
    sandbox = backend.layout.sandbox("sb-inj-run-crash")
    sandbox.dir.mkdir(mode=0o700)
    run_folder.mount(injected.run_dir(sandbox), None)
    (injected.run_dir(sandbox) / injected.TOKEN_KEY_FILE).write_bytes(b"k" * 64)
    restarted = LocalBackend(backend.settings)
    try:
        listed = {s.sandbox_id for s in loop.run_until_complete(restarted.list())}
        assert sandbox.sandbox_id in listed
        loop.run_until_complete(restarted.delete(sandbox.sandbox_id))
    finally:
        loop.run_until_complete(restarted.close())
    assert not mounts_under(sandbox.dir) and not sandbox.dir.exists()
