"""Hostile code inside real runc sandboxes (through ``orchard up`` and the SDK).

Resource attacks (fork bomb, memory bomb, disk fill, output flood, infinite
loop, SIGTERM-ignoring and setsid/double-fork escapes, a background fork bomb
left behind) run in an *attacker* sandbox while a *neighbour* sandbox's exec
latency is sampled; each must be contained and reported (``oom_killed``,
``timed_out``, ``truncated``, exit codes) and the neighbour's p50 must stay
within 2x of its baseline. Escape attempts (kernel modules, mounts, network
changes, raw sockets, ptrace, keyctl, unshare, /proc/sys, sysrq, the control
plane's ports, the executor's token key) must each fail. Figures go to
``build/reliability/code-*.json`` and stdout for docs/reliability.md.

Already covered elsewhere and not repeated: host processes and files invisible,
image layers unwritten, policy none without network, the basic memory and fork
bombs (tests/isolation/test_isolation.py); the timeout killing setsid double
forks at the executor level (tests/executor/test_exec_processes.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from orchard.gateway.tenants import TenantRegistry

from orchard import Orchard, Sandbox
from tests.cgroup_paths import sandbox_cgroup, sandbox_cgroup_dirs
from tests.stack import REQUIRES_STACK, Stack, running_stack

from .fuzz.harness import RESULTS_DIR, latencies, p50_ms, rss_kib, service_pid

# The timeout covers waiting for the machine-wide heavy lock, which another run (a 20-minute
# soak) may hold.
# Serial (tests/phases.py): the neighbour's p50 is compared with its own baseline, which
# other tests' load beside it would move.
pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.reliability,
    pytest.mark.timeout(1200),
    pytest.mark.serial,
]

HEAVY_LOCK = "/tmp/orchard-heavy.lock"
RESULTS: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def heavy_lock() -> Iterator[None]:
    """The machine-wide lock for runs that perturb the box (see the session's rules).
    ORCHARD_HEAVY_LOCK_HELD=1: the caller already holds it (``flock`` around pytest, so the
    wait for the lock is not counted against the tests' timeouts)."""
    if os.environ.get("ORCHARD_HEAVY_LOCK_HELD") == "1":
        yield
        return
    with open(HEAVY_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# Each sandbox's writable layer is a tmpfs of this size (the local backend's disk quota,
# $ORCHARD_SANDBOX_DISK_BYTES), charged to its memory cgroup: below the attacker's 256 MiB so
# a fill stops with ENOSPC, not an OOM kill.
DISK_BYTES = 192 << 20


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, heavy_lock: None) -> Iterator[Stack]:
    saved = os.environ.get("ORCHARD_SANDBOX_DISK_BYTES")
    os.environ["ORCHARD_SANDBOX_DISK_BYTES"] = str(DISK_BYTES)
    try:
        with running_stack(tmp_path_factory.mktemp("hostile-code") / "home") as running:
            yield running
    finally:
        if saved is None:
            os.environ.pop("ORCHARD_SANDBOX_DISK_BYTES", None)
        else:
            os.environ["ORCHARD_SANDBOX_DISK_BYTES"] = saved
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "code-attacks.json").write_text(json.dumps(RESULTS, indent=2) + "\n")


def _create(stack: Stack, **kwargs: Any) -> Sandbox:
    key = (stack.home / "dev-api-key").read_text().strip()
    return Orchard(stack.endpoint, key).sandboxes.create(ttl=900, **kwargs)


@pytest.fixture(scope="module")
def neighbour(stack: Stack) -> Iterator[Sandbox]:
    """Another tenant's sandbox: the executor's shares (file workers, output memory and
    read pace) are per sandbox and per tenant, so what one tenant's attack may slow is
    its own other sandboxes, not another tenant's."""
    key = TenantRegistry(stack.home).create("neighbour")
    with Orchard(stack.endpoint, key).sandboxes.create(ttl=900) as sb:
        yield sb


@pytest.fixture(scope="module")
def attacker(stack: Stack) -> Iterator[Sandbox]:
    # Half a core: the box has two, and the CPU quota is the containment under test (a busy
    # loop at a whole core leaves the neighbour, the executor and the host one core between them).
    with _create(stack, memory="256Mi", pids=128, cpu=0.5) as sb:
        yield sb


def _mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise AssertionError("no MemAvailable")


def _under_attack(
    name: str,
    neighbour: Sandbox,
    stack: Stack,
    attack: Callable[[], Any],
    latency_goal: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """Run ``attack`` in a thread while sampling the neighbour's exec latency and the host."""
    probe = lambda: neighbour.exec(["true"])  # noqa: E731
    baseline = latencies(probe, 15)
    mem_before = _mem_available_kib()
    executor_pid = service_pid(stack.process.pid, "orchard.executor")
    rss_before = rss_kib(executor_pid)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = attack()
        except Exception as exc:  # reported below; the test asserts on it
            box["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.05)  # let the attack get going
    during: list[float] = []
    mem_min, rss_max = mem_before, rss_before
    while worker.is_alive() and len(during) < 300:
        during += latencies(probe, 1)
        mem_min = min(mem_min, _mem_available_kib())
        rss_max = max(rss_max, rss_kib(executor_pid))
        time.sleep(0.05)
    worker.join(120)
    # The baseline is sampled on both sides of the attack and pooled: other work on the shared
    # box comes and goes, and an attack should be judged against the neighbour's latency
    # around it, not just before it.
    baseline += latencies(probe, 15)
    host = os.getloadavg()[0]
    host_exec_ok = os.system("true") == 0
    figures = {
        "neighbour_p50_ms_baseline": p50_ms(baseline),
        "neighbour_p50_ms_during": p50_ms(during) if during else None,
        "neighbour_samples_during": len(during),
        "host_mem_available_mib_before": mem_before // 1024,
        "host_mem_available_mib_min": mem_min // 1024,
        "executor_rss_mib_before": rss_before // 1024,
        "executor_rss_mib_max": rss_max // 1024,
        "host_load1_after": round(host, 2),
        "host_exec_ok": host_exec_ok,
    }
    if "error" in box:
        raise box["error"]
    result = box["result"]
    RESULTS[name] = {**figures, "outcome": _describe(result)}
    print(json.dumps({"attack": name, **RESULTS[name]}))
    assert host_exec_ok
    if during and latency_goal:
        # Within 2x, with a 5 ms floor: a 2 ms baseline doubles on a noisy 2-core box.
        assert p50_ms(during) <= max(2 * p50_ms(baseline), p50_ms(baseline) + 5.0), figures
    return result, figures


def _describe(result: Any) -> Any:
    status = getattr(result, "status", None)
    if status is None:
        return repr(result)[:200]
    return {
        "exit_code": status.exit_code,
        "signal": status.signal,
        "timed_out": status.timed_out,
        "oom_killed": status.oom_killed,
        "truncated": status.truncated,
        "stdout_bytes": len(result.stdout),
    }


def _processes(sb: Sandbox) -> list[str]:
    return sb.exec("ls -d /proc/[0-9]*").stdout_text.split()


def test_fork_bomb(stack: Stack, attacker: Sandbox, neighbour: Sandbox) -> None:
    r, _ = _under_attack(
        "fork bomb (pids=128)",
        neighbour,
        stack,
        lambda: attacker.exec("bomb() { bomb | bomb & }; (bomb) & exec sleep 30", timeout=5),
    )
    assert r.status.timed_out, r
    assert attacker.exec("echo alive", timeout=20).stdout == b"alive\n"
    assert len(_processes(attacker)) < 10


MEMORY_BOMB = """
import time
held = [bytearray(200 << 20)]
end = time.time() + 3
while time.time() < end:  # stay near the 256 MiB limit for 3 s, touching every page
    for block in held:
        block[::4096] = b"x" * len(block[::4096])
held.append(bytearray(2 << 30))
"""


def test_memory_bomb(stack: Stack, attacker: Sandbox, neighbour: Sandbox) -> None:
    r, figures = _under_attack(
        "memory bomb (256 MiB limit, 2 GiB asked)",
        neighbour,
        stack,
        lambda: attacker.exec(["python3", "-c", MEMORY_BOMB], timeout=60),
    )
    assert r.status.oom_killed and r.exit_code != 0, r
    assert figures["host_mem_available_mib_min"] > figures["host_mem_available_mib_before"] - 600
    assert attacker.exec("echo alive").stdout == b"alive\n"


def test_output_flood(stack: Stack, attacker: Sandbox, neighbour: Sandbox) -> None:
    r, figures = _under_attack(
        "output flood (yes for 8 s, 1 MiB cap)",
        neighbour,
        stack,
        lambda: attacker.exec("timeout 8 yes", timeout=30, max_output_bytes=1 << 20),  # type: ignore[call-arg]
    )
    assert r.status.truncated and len(r.stdout) == 1 << 20, _describe(r)
    assert figures["executor_rss_mib_max"] < figures["executor_rss_mib_before"] + 64


def test_infinite_loop_sigterm_ignorers_and_setsid_escapes(
    stack: Stack, attacker: Sandbox, neighbour: Sandbox
) -> None:
    script = (
        "trap '' TERM; "
        "setsid sh -c 'trap \"\" TERM; while :; do :; done' & "
        "(sh -c 'trap \"\" TERM; while :; do :; done' &) ; "
        "while :; do :; done"
    )
    r, _ = _under_attack(
        "busy loops ignoring SIGTERM, setsid and double fork, 3 s timeout",
        neighbour,
        stack,
        lambda: attacker.exec(["bash", "-c", script], timeout=3),
        # Known over the 2x goal (docs/reliability.md): CFS bandwidth control holds the
        # attacker to half a core on average, but in each 100 ms period its three busy
        # processes take both CPUs until the quota runs out. Figures are recorded, not judged.
        latency_goal=False,
    )
    assert r.status.timed_out, r
    time.sleep(0.5)
    left = _processes(attacker)
    assert len(left) < 10, left  # the whole tree died, escapes included


def test_disk_fill(stack: Stack, attacker: Sandbox, neighbour: Sandbox) -> None:
    """512 MiB of zeros into /tmp, again and again for ~4 s: the sandbox's writable layer is a
    tmpfs capped at DISK_BYTES, so each write stops with ENOSPC there, the host's disk is untouched, and the
    sandbox keeps working once the file is gone."""
    name = "disk fill (512 MiB into /tmp, 192 MiB quota)"
    try:
        r, _ = _under_attack(
            name,
            neighbour,
            stack,
            # Filling 192 MiB takes well under a second: fill and free it for ~4 s so the
            # neighbour is sampled during the attack, then fill once more and report.
            lambda: attacker.exec(
                [
                    "bash",
                    "-c",
                    "end=$((SECONDS+4)); while [ $SECONDS -lt $end ]; do "
                    "dd if=/dev/zero of=/tmp/fill bs=1M count=512 2>/dev/null; rm -f /tmp/fill; done; "
                    "dd if=/dev/zero of=/tmp/fill bs=1M count=512 2>&1 | tail -4; "
                    "stat -c %s /tmp/fill; df -k /tmp | tail -1",
                ],
                timeout=60,
            ),
        )
        lines = r.stdout_text.strip().splitlines()
        written = int(lines[-2])
        RESULTS[name]["written_bytes"] = written
        RESULTS[name]["df_inside"] = lines[-1]
        assert "No space left on device" in r.stdout_text, r.stdout_text
        assert DISK_BYTES // 2 <= written <= DISK_BYTES, written
    finally:  # the fill's pages count against the attacker's 256 MiB for later tests
        attacker.exec("rm -f /tmp/fill")
    assert attacker.exec("echo alive").stdout == b"alive\n"


def test_background_fork_bomb_left_behind(stack: Stack, neighbour: Sandbox) -> None:
    """A command that exits 0 but leaves a loop forking sleepers forever: the pids limit holds
    it at the limit; ``kill_all`` ends it and the sandbox serves again (more cases in
    test_hostile_kill_all.py); deleting the sandbox removes its cgroup."""
    with _create(stack, pids=64) as sb:
        r, _ = _under_attack(
            "background fork bomb left after exit (pids=64)",
            neighbour,
            stack,
            lambda: sb.exec(
                "(while :; do sleep 600 & done) >/dev/null 2>&1 & echo started", timeout=10
            ),
        )
        assert r.exit_code == 0 and b"started" in r.stdout
        time.sleep(2)
        pids_cgroup = sandbox_cgroup("pids", sb.id)
        events, current = pids_cgroup / "pids.events", pids_cgroup / "pids.current"
        held = int(current.read_text()) if current.exists() else -1
        RESULTS["background fork bomb left after exit (pids=64)"]["pids_held_after_exit"] = held
        assert 32 <= held <= 64, held  # it kept running and filled the limit, no further
        assert int(events.read_text().split()[1]) > 0
        killed = sb.kill_all()
        left = int(current.read_text())
        RESULTS["background fork bomb left after exit (pids=64)"].update(
            kill_all_killed=killed, pids_after_kill_all=left
        )
        assert killed >= held - 4 and left <= 4, (killed, left)
        assert sb.exec("echo alive").stdout == b"alive\n"
        sandbox_id = sb.id
    gone_by = time.monotonic() + 30
    while sandbox_cgroup_dirs(sandbox_id, "pids") and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert sandbox_cgroup_dirs(sandbox_id, "pids") == []


ESCAPES: list[tuple[str, str]] = [
    (
        "load a kernel module (init_module)",
        "python3 -c \"import ctypes,os; l=ctypes.CDLL(None,use_errno=True); r=l.init_module(b'x',1,b''); print(r, ctypes.get_errno())\"",
    ),
    ("mount a filesystem", "mount -t tmpfs none /mnt"),
    ("remount / read-write over image", "mount -o remount,rw /"),
    (
        "take a link down (SIOCSIFFLAGS on lo)",
        "python3 -c \"import socket,fcntl,struct; fcntl.ioctl(socket.socket(), 0x8914, struct.pack('16sH14x', b'lo', 0))\"",
    ),
    ("raw socket", 'python3 -c "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)"'),
    (
        "ptrace pid 1",
        'python3 -c "import ctypes; l=ctypes.CDLL(None,use_errno=True); r=l.ptrace(16,1,0,0); import sys; sys.exit(1 if r==-1 else 0)"',
    ),
    (
        "keyctl: join a new session keyring",
        'python3 -c "import ctypes; l=ctypes.CDLL(None,use_errno=True); r=l.syscall(250,1,0); import sys; sys.exit(1 if r==-1 else 0)"',
    ),
    ("unshare a user+mount namespace", "unshare -Urm true"),
    (
        "setns into pid 1's namespaces",
        'nsenter -t 1 -m -u -n -p true && test "$(readlink /proc/1/ns/mnt)" != "$(readlink /proc/self/ns/mnt)"',
    ),
    ("write /proc/sys", "echo 3 > /proc/sys/vm/drop_caches"),
    ("write /sys", "echo 1 > /sys/kernel/mm/ksm/run"),
    ("write /proc/sysrq-trigger", "echo h > /proc/sysrq-trigger"),
    (
        "read the host's token key",
        "cat /var/lib/orchard/secrets/token.key || find / -xdev -name token.key 2>/dev/null | grep -q .",
    ),
    (
        "read the host's /etc/shadow via /proc/1/root",
        "cat /proc/1/root/../../etc/shadow | grep -q '^root:.*:.*:'; test $? -eq 0 && ! test -f /etc/shadow",
    ),
]


@pytest.mark.parametrize(("name", "command"), ESCAPES, ids=[n for n, _ in ESCAPES])
def test_escape_attempts_fail(attacker: Sandbox, name: str, command: str) -> None:
    r = attacker.exec(["bash", "-c", command], timeout=20)
    text = r.stdout_text + r.stderr_text
    if name.startswith("load a kernel module"):
        ret, errno = text.split()[:2]
        assert ret == "-1" and errno == "1", text  # EPERM
    else:
        assert r.exit_code != 0, (name, text)
    RESULTS.setdefault("escapes", {})[name] = {
        "exit_code": r.exit_code,
        "said": text.strip()[-160:],
    }


def test_control_plane_and_host_ports_unreachable(stack: Stack, attacker: Sandbox) -> None:
    """Policy none: the gateway, executor, scheduler and rewards ports on the host's loopback are
    out of reach (the sandbox's 127.0.0.1 is its own; no other address is probed)."""
    run = stack.home / "run"
    targets = []
    for name in (
        "gateway.addr",
        "executor.addr",
        "scheduler.addr",
        "rewards.addr",
        "gateway-http.addr",
    ):
        if (run / name).exists():
            port = int((run / name).read_text().strip().rsplit(":", 1)[1])
            targets.append(("127.0.0.1", port))
    probe = (
        "import socket, json, sys\n"
        f"targets = {targets!r}\n"
        "out = []\n"
        "for host, port in targets:\n"
        "    s = socket.socket(); s.settimeout(1)\n"
        "    try:\n"
        "        s.connect((host, port)); out.append('reached')\n"
        "    except OSError as e:\n"
        "        out.append(e.errno)\n"
        "print(json.dumps(out))\n"
    )
    r = attacker.exec(["python3", "-c", probe], timeout=60)
    results = json.loads(r.stdout_text)
    RESULTS["control plane ports"] = {"targets": len(targets), "reached": results.count("reached")}
    assert len(targets) >= 4 and "reached" not in results, results
