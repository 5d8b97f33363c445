"""The local backend against the real machine: runc containers, overlayfs, cgroups, netns.

Each check looks at the host (``/proc``, ``/sys/fs/cgroup``, mountinfo, the
sandbox folder), not at what the backend says about itself. Tests are
synchronous and drive the backend with ``run(...)`` on the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeAlias

import pytest
from orchard.scheduler.backends import BackendError, SandboxSpec
from orchard.scheduler.backends.local import cgroups, oci_config, overlay
from orchard.scheduler.backends.local.backend import LocalBackend
from orchard.scheduler.backends.local.runc import process_start_time
from orchard.scheduler.backends.local.settings import LocalSettings

from orchard.common.layout import SandboxMeta
from tests.cgroup_paths import sandbox_cgroup_dirs

from .runtime_helpers import NAMESPACES, Footprint, init_exec, mounts_under, ns_link, nsenter

pytestmark = pytest.mark.runc

Run: TypeAlias = Callable[[Awaitable[Any]], Any]
MIB = 1 << 20

# Capability bits that must not be in a sandbox's sets.
FORBIDDEN_CAPS = {
    "CAP_NET_ADMIN": 12,
    "CAP_NET_RAW": 13,
    "CAP_SYS_MODULE": 16,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_TIME": 25,
    "CAP_MKNOD": 27,
}


def spec(sandbox_id: str, **overrides: Any) -> SandboxSpec:
    fields: dict[str, Any] = {
        "sandbox_id": sandbox_id,
        "image": "",
        "cpu_millis": 500,
        "memory_bytes": 256 * MIB,
        "pids": 200,
        "network_mode": "none",
        "env": {"TASK": "demo", "HOME": "/work"},
    }
    fields.update(overrides)
    return SandboxSpec(**fields)


def proc_status(pid: int) -> dict[str, str]:
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    return status


async def together(*awaitables: Awaitable[Any]) -> list[Any]:
    """``asyncio.gather`` as a coroutine, so it starts inside the test's loop."""
    return list(await asyncio.gather(*awaitables))


def wait_gone(pid: int, timeout: float = 5.0) -> None:
    """Wait until ``pid`` has exited (a zombie waiting for the host's reaper counts as gone)."""
    deadline = time.monotonic() + timeout
    while process_start_time(pid) is not None:
        assert time.monotonic() < deadline, f"pid {pid} did not exit"
        time.sleep(0.01)


def test_sandbox_is_isolated_and_limited(backend: LocalBackend, run: Run, home: Path) -> None:
    made = run(backend.create(spec("iso-1", tenant="acme")))
    pid = made.init_pid
    assert made.running and pid > 0

    # Its own namespaces, compared with ours.
    for ns in NAMESPACES:
        assert ns_link(pid, ns) != ns_link("self", ns), f"{ns} namespace is shared"

    # cgroup limits, read from the cgroup files (under its tenant's group).
    memory = Path("/sys/fs/cgroup/memory/orchard/t-acme/iso-1")
    assert str(pid) in (memory / "cgroup.procs").read_text().split()
    assert int((memory / "memory.limit_in_bytes").read_text()) == 256 * MIB
    assert int((memory / "memory.memsw.limit_in_bytes").read_text()) == 256 * MIB
    cpu = Path("/sys/fs/cgroup/cpu/orchard/t-acme/iso-1")
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == 50_000
    assert int((cpu / "cpu.cfs_period_us").read_text()) == 100_000
    assert Path("/sys/fs/cgroup/pids/orchard/t-acme/iso-1/pids.max").read_text().strip() == "200"

    # Privileges: no_new_privs and none of the dangerous capabilities.
    status = proc_status(pid)
    assert status["NoNewPrivs"] == "1"
    for key in ("CapEff", "CapPrm", "CapBnd"):
        bits = int(status[key], 16)
        for cap, bit in FORBIDDEN_CAPS.items():
            assert not bits & (1 << bit), f"{cap} in {key}"
    assert int(status["CapEff"], 16) & (1 << 0), "CAP_CHOWN expected"

    # sandbox.json for the executor: image env overlaid with the spec's env.
    meta = SandboxMeta.from_json((home / "sandboxes/iso-1/sandbox.json").read_text())
    assert meta.init_pid == pid
    assert meta.memory_cgroup == str(memory)
    assert meta.env["TASK"] == "demo" and meta.env["HOME"] == "/work"
    assert "/usr/bin" in meta.env["PATH"]
    assert meta.cwd == "/"

    # The hostname is the sandbox id; pid 1 inside is init.
    assert nsenter(pid, "hostname").strip() == "iso-1"
    assert nsenter(pid, "cat", "/proc/1/cmdline").split("\0")[0] == "/.orchard/init"
    # Docker-like masked and read-only paths.
    assert Path("/proc/timer_list").read_text() != ""
    assert nsenter(pid, "cat", "/proc/timer_list") == ""
    with pytest.raises(subprocess.CalledProcessError):
        nsenter(pid, "sh", "-c", "echo 1 > /proc/sys/kernel/domainname")

    # The product path: a command through orchard-init's socket.
    if _real_init(backend):
        code, out = init_exec(
            home / "sandboxes/iso-1/init.sock",
            ["/bin/sh", "-c", "echo $TASK; hostname; id -u"],
            meta.env,
        )
        assert (code, out) == (0, b"demo\niso-1\n0\n")
        # seccomp: no user namespaces (the door to mounts etc.), no mount;
        # ordinary work (python, threads, git, forks) still runs.
        for refused in ("unshare -Ur true", "unshare -m true", "mount -t tmpfs x /mnt"):
            code, _ = init_exec(
                home / "sandboxes/iso-1/init.sock", ["/bin/sh", "-c", refused], meta.env
            )
            assert code != 0, f"{refused!r} was allowed"
        code, out = init_exec(
            home / "sandboxes/iso-1/init.sock",
            [
                "/bin/sh",
                "-c",
                "python3 -c 'import threading as t; x = t.Thread(target=print, args=[True]);"
                " x.start(); x.join()'; git --version",
            ],
            meta.env,
        )
        assert code == 0 and out.startswith(b"True\ngit version"), out


def test_overlay_root_leaves_image_layers_untouched(
    backend: LocalBackend, run: Run, home: Path, images_dir: Path
) -> None:
    made = run(backend.create(spec("ovl-1")))
    sandbox_dir = home / "sandboxes/ovl-1"
    layer = images_dir / "debian+bookworm/layers/0"
    with open("/proc/self/mountinfo") as mountinfo:
        lines = [line for line in mountinfo if f" {sandbox_dir}/rootfs " in line]
    assert len(lines) == 1 and " - overlay " in lines[0], lines
    # lowerdir+= when the layers were given one by one (upper/work on a tmpfs, scratch.py);
    # with user namespaces (the default) each is an idmapped clone passed by fd, shown as /.
    if backend.uid_ranges is not None:
        assert "lowerdir+=/," in lines[0], lines[0]
    else:
        assert f"lowerdir={layer}" in lines[0] or f"lowerdir+={layer}" in lines[0]

    before = (layer / "etc/debian_version").read_bytes()
    nsenter(made.init_pid, "sh", "-c", "echo changed > /etc/debian_version; echo new > /root/new")
    assert nsenter(made.init_pid, "cat", "/etc/debian_version") == "changed\n"
    assert (layer / "etc/debian_version").read_bytes() == before
    assert not (layer / "root/new").exists()
    if (sandbox_dir / "upper").is_dir():  # without tmpfs the upper dir is in the folder
        assert (sandbox_dir / "upper/root/new").read_text() == "new\n"
        assert (sandbox_dir / "upper/etc/debian_version").read_text() == "changed\n"
    # The init binary is there read-only and not part of any image layer.
    with pytest.raises(subprocess.CalledProcessError):
        nsenter(made.init_pid, "sh", "-c", "echo x > /.orchard/init")
    assert not (layer / ".orchard").exists()


def test_network_none_has_only_loopback_and_it_is_up(backend: LocalBackend, run: Run) -> None:
    made = run(backend.create(spec("net-1")))
    dev = Path(f"/proc/{made.init_pid}/net/dev").read_text().splitlines()[2:]
    assert [line.split(":")[0].strip() for line in dev] == ["lo"]
    links = subprocess.run(
        ["nsenter", "-t", str(made.init_pid), "-n", "ip", "-o", "link", "show"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert len(links) == 1 and ": lo:" in links[0]
    assert "<LOOPBACK,UP" in links[0], links[0]
    # Loopback works: a listener inside is reachable from inside.
    out = nsenter(
        made.init_pid,
        "python3",
        "-c",
        "import socket; s=socket.create_server(('127.0.0.1', 0)); "
        "c=socket.create_connection(s.getsockname()); print('connected')",
    )
    assert out.strip() == "connected"


def test_delete_leaves_nothing_behind(backend: LocalBackend, run: Run, home: Path) -> None:
    made = run(backend.create(spec("del-1")))
    footprint = Footprint.of(home, "del-1", made.init_pid)
    assert len(footprint.leftovers()) >= 5  # the probe sees a live sandbox
    run(backend.delete("del-1"))
    assert footprint.leftovers() == []
    assert run(backend.inspect("del-1")) is None
    assert run(backend.list()) == []
    # Idempotent: again, and for a sandbox that never existed.
    run(backend.delete("del-1"))
    run(backend.delete("never-made"))
    assert footprint.leftovers() == []


def test_delete_finishes_when_the_teardown_weight_cannot_be_set(
    backend: LocalBackend, run: Run, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The top CPU weight before the kill only speeds a teardown up: when writing it
    fails (as a cgroup2 folder refusing a v1 file once did), the sandbox still goes."""
    made = run(backend.create(spec("del-w")))
    footprint = Footprint.of(home, "del-w", made.init_pid)

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", "cpu.shares")

    monkeypatch.setattr(cgroups, "set_cpu_weight", refuse)
    run(backend.delete("del-w"))
    assert footprint.leftovers() == []


def test_twenty_concurrent_creates_and_deletes(backend: LocalBackend, run: Run, home: Path) -> None:
    ids = [f"par-{i:02d}" for i in range(20)]
    made = run(together(*(backend.create(spec(i)) for i in ids)))
    assert all(m.running for m in made)
    assert len({m.init_pid for m in made}) == 20
    footprints = [Footprint.of(home, m.sandbox_id, m.init_pid) for m in made]
    listed = run(backend.list())
    assert sorted(s.sandbox_id for s in listed if s.running) == ids
    run(together(*(backend.delete(i) for i in ids)))
    for footprint in footprints:
        assert footprint.leftovers() == []
    assert run(backend.list()) == []


def test_delete_of_half_created_sandboxes(
    backend: LocalBackend,
    run: Run,
    settings: LocalSettings,
    home: Path,
    images_dir: Path,
    init_binary: Path,
) -> None:
    """A crash can stop a create anywhere; delete must clean up every such state."""
    layer = images_dir / "debian+bookworm/layers/0"

    def prepare(sandbox_id: str) -> Path:
        sandbox_dir = home / "sandboxes" / sandbox_id
        for sub in ("rootfs", "upper", "work"):
            (sandbox_dir / sub).mkdir(parents=True)
        overlay.mount_overlay(
            sandbox_dir / "rootfs", [layer], sandbox_dir / "upper", sandbox_dir / "work"
        )
        config = oci_config.build_config(
            sandbox_id=sandbox_id,
            rootfs=sandbox_dir / "rootfs",
            init_binary=init_binary,
            limits=oci_config.ContainerLimits(500, 128 * MIB, 64),
        )
        oci_config.write_config(sandbox_dir, config)
        return sandbox_dir

    # 1. Folder and mounted overlay, runc never ran.
    prepare("half-mounted")
    # 2. `runc create` done (container made, its init waiting to start), never started.
    created_dir = prepare("half-created")
    runc_create = ["runc", "--root", str(settings.runc_root), "create", "--bundle"]
    subprocess.run(
        [*runc_create, str(created_dir), "half-created"],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # runc's child keeps them open: no pipes
        stderr=subprocess.DEVNULL,
        timeout=30,
    )
    state = json.loads((settings.runc_root / "half-created/state.json").read_text())
    waiting_pid = int(state["init_process_pid"])
    assert process_start_time(waiting_pid) is not None
    # 3. runc died before writing its state: an empty state dir.
    (settings.runc_root / "half-state").mkdir(parents=True)
    # 4. Only the folder.
    (home / "sandboxes/half-folder").mkdir()

    listed = {s.sandbox_id: s for s in run(backend.list())}
    assert set(listed) == {"half-mounted", "half-created", "half-state", "half-folder"}
    assert not listed["half-mounted"].running
    for sandbox_id in listed:
        run(backend.delete(sandbox_id))
    assert run(backend.list()) == []

    assert mounts_under(home) == []
    wait_gone(waiting_pid)
    assert list((home / "sandboxes").iterdir()) == []
    assert list(settings.runc_root.iterdir()) == []
    for sandbox_id in ("half-mounted", "half-created"):
        assert sandbox_cgroup_dirs(sandbox_id) == []


def test_a_new_backend_finds_sandboxes_after_a_crash(
    backend: LocalBackend, run: Run, settings: LocalSettings
) -> None:
    first = run(backend.create(spec("crash-1")))
    stopped = run(backend.create(spec("crash-2")))
    # The scheduler dies (no close, nothing saved); a new one starts.
    restarted = LocalBackend(settings)
    try:
        found = {s.sandbox_id: s for s in run(restarted.list())}
        assert set(found) == {"crash-1", "crash-2"}
        assert found["crash-1"].running and found["crash-1"].init_pid == first.init_pid
        # An init that died on its own: the folder stays, it counts as not running.
        os.kill(stopped.init_pid, signal.SIGKILL)
        wait_gone(stopped.init_pid)
        again = run(restarted.inspect("crash-2"))
        assert again is not None and not again.running and again.init_pid == 0
        run(restarted.delete("crash-1"))
        run(restarted.delete("crash-2"))
        assert run(restarted.list()) == []
    finally:
        run(restarted.close())


def test_refusals(backend: LocalBackend, run: Run, home: Path) -> None:
    with pytest.raises(BackendError) as err:
        run(backend.create(spec("img-1", image="no-such-image:1")))
    assert err.value.reason == "IMAGE_NOT_FOUND" and err.value.client_fault
    with pytest.raises(BackendError) as err:
        run(backend.create(spec("net-2", network_mode="host")))
    assert err.value.reason == "UNSUPPORTED" and err.value.client_fault
    with pytest.raises(BackendError) as err:
        run(backend.create(spec("../escape")))
    assert err.value.client_fault
    for tenant in ("../x", "a/b", ".hidden", "x" * 65, "tab\there"):
        with pytest.raises(BackendError) as err:
            run(backend.create(spec("ten-1", tenant=tenant)))
        assert err.value.client_fault and "cannot name a cgroup" in err.value.message
    assert list((home / "sandboxes").iterdir()) == []

    made = run(backend.create(spec("dup-1")))
    with pytest.raises(BackendError) as err:
        run(backend.create(spec("dup-1")))
    assert err.value.reason == "ALREADY_EXISTS"
    # The failed second create did not harm the first sandbox.
    again = run(backend.inspect("dup-1"))
    assert again is not None and again.running and again.init_pid == made.init_pid
    assert (home / "sandboxes/dup-1/init.sock").exists()


def test_tenants_get_a_cpu_group_each_and_empty_groups_go_on_close(
    settings: LocalSettings, run: Run
) -> None:
    """Sandboxes sit in their tenant's group (unclaimed pool members in ``pool``), so the
    kernel shares the CPU between tenants before sandboxes; close removes empty groups."""
    backend = LocalBackend(settings)
    orchard_cpu = Path("/sys/fs/cgroup/cpu/orchard")
    try:
        run(backend.create(spec("grp-a1", tenant="grp-alice")))
        run(backend.create(spec("grp-a2", tenant="grp-alice")))
        run(backend.create(spec("grp-b1", tenant="grp-bob")))
        run(backend.create(spec("grp-p1")))
        for group, members in (
            ("t-grp-alice", ["grp-a1", "grp-a2"]),
            ("t-grp-bob", ["grp-b1"]),
            ("pool", ["grp-p1"]),
        ):
            for member in members:
                assert (orchard_cpu / group / member / "cpu.shares").exists(), (group, member)
        assert not (orchard_cpu / "grp-a1").exists()  # not directly under orchard
        for sandbox_id in ("grp-a1", "grp-a2", "grp-b1"):
            run(backend.delete(sandbox_id))
            assert sandbox_cgroup_dirs(sandbox_id) == []
        # Groups stay while the backend runs (a create may be mid-way into one).
        assert (orchard_cpu / "t-grp-alice").is_dir()
    finally:
        run(backend.close())
    # Closed: the empty tenant groups are gone; the pool group still holds a sandbox.
    assert not list(Path("/sys/fs/cgroup").glob("*/orchard/t-grp-alice"))
    assert not list(Path("/sys/fs/cgroup").glob("*/orchard/t-grp-bob"))
    assert (orchard_cpu / "pool" / "grp-p1").is_dir()
    reopened = LocalBackend(settings)
    try:
        run(reopened.delete("grp-p1"))
        assert sandbox_cgroup_dirs("grp-p1") == []
    finally:
        run(reopened.close())


def test_images_lists_the_default_image(backend: LocalBackend, run: Run) -> None:
    images = run(backend.images())
    default = [i for i in images if i.is_default]
    assert len(default) == 1 and default[0].name == "debian:bookworm"
    assert default[0].layers == 1 and default[0].size_bytes > 50 * MIB


def test_create_and_delete_timings(backend: LocalBackend, run: Run) -> None:
    """Prints cold create/delete latency (one at a time) and burst throughput; no target asserted."""
    count = 50
    creates, deletes = [], []
    for i in range(count):
        started = time.perf_counter()
        run(backend.create(spec(f"seq-{i:02d}")))
        creates.append(time.perf_counter() - started)
    for i in range(count):
        started = time.perf_counter()
        run(backend.delete(f"seq-{i:02d}"))
        deletes.append(time.perf_counter() - started)
    started = time.perf_counter()
    run(together(*(backend.create(spec(f"burst-{i:02d}")) for i in range(count))))
    burst_create = time.perf_counter() - started
    started = time.perf_counter()
    run(together(*(backend.delete(f"burst-{i:02d}") for i in range(count))))
    burst_delete = time.perf_counter() - started
    print(
        f"\ncold create p50 {statistics.median(creates) * 1000:.1f} ms "
        f"p90 {statistics.quantiles(creates, n=10)[-1] * 1000:.1f} ms; "
        f"delete p50 {statistics.median(deletes) * 1000:.1f} ms; "
        f"burst of {count}: create {burst_create:.2f} s "
        f"({burst_create / count * 1000:.1f} ms each), delete {burst_delete:.2f} s"
    )
    assert run(backend.list()) == []


def _real_init(backend: LocalBackend) -> bool:
    binary = backend.settings.init_binary
    return binary is not None and binary.name.startswith("orchard-init")


@pytest.mark.skipif(shutil.which("runsc") is None, reason="needs gVisor's runsc")
def test_required_user_namespaces_refuse_a_runsc_create_by_name(
    settings: LocalSettings, run: Run, home: Path, tmp_path: Path
) -> None:
    """ORCHARD_USERNS=1 (userns_required): the runtime class without namespaces (runsc)
    is refused with UNSUPPORTED naming the setting, before any folder is made; by default
    the same create would run without one (tests/injected/test_runsc_userns.py). runc and
    injected sandboxes have them (tests/injected/test_injected_userns.py)."""
    required = LocalBackend(
        replace(settings, userns_required=True, executor_bundle=tmp_path / "bundle")
    )
    try:
        with pytest.raises(BackendError) as refused:
            run(required.create(spec("gv-1", runtime_class="runsc")))
        assert refused.value.reason == "UNSUPPORTED"
        assert "ORCHARD_USERNS=1" in refused.value.message
        assert not (home / "sandboxes/gv-1").exists()
    finally:
        run(required.close())
