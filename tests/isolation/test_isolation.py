"""Isolation as a user sees it: sandboxes from a real ``orchard up`` (runc), driven by the SDK.

Each test attacks from inside a sandbox and checks the outcome from the host:
host processes and files stay invisible, image layers stay unwritten, policy
``none`` has no network, memory and fork bombs are contained and reported, and
the host and a neighbour sandbox keep working.
"""

from __future__ import annotations

import hashlib
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import orchard
from orchard import Orchard, Sandbox
from tests.cgroup_paths import sandbox_cgroup
from tests.stack import IMAGES_DIR, REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("isolation") / "home") as running:
        yield running


def _create(stack: Stack, **kwargs: object) -> Sandbox:
    key = (stack.home / "dev-api-key").read_text().strip()
    return Orchard(stack.endpoint, key).sandboxes.create(ttl=600, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sandbox(stack: Stack) -> Iterator[Sandbox]:
    with _create(stack) as sb:
        yield sb


def test_host_processes_are_invisible(sandbox: Sandbox) -> None:
    marker = f"orchard-host-marker-{secrets.token_hex(6)}"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        r = sandbox.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        assert r.exit_code == 0 and r.stdout, r
        assert marker not in r.stdout_text and "pytest" not in r.stdout_text
        pids = sandbox.exec("ls -d /proc/[0-9]*").stdout_text.split()
        assert len(pids) < 10, pids  # init, the shim, this command: not the host's hundreds
        # Its own pid 1 is the sandbox init, not the host's.
        assert sandbox.exec("cat /proc/1/cmdline").stdout.split(b"\0")[0] == b"/.orchard/init"
    finally:
        host.kill()
        host.wait()


def test_host_files_are_invisible(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = Path("/tmp") / f"orchard-host-secret-{secrets.token_hex(6)}"
    secret.write_text("host only")
    try:
        assert sandbox.exec(["test", "-e", str(secret)]).exit_code == 1
        assert sandbox.exec(["test", "-e", str(Path(__file__).resolve())]).exit_code == 1
        with pytest.raises(orchard.PathNotFoundError):
            sandbox.read_file(str(secret))
        # An absolute symlink planted inside resolves inside the sandbox, never on the host.
        sandbox.exec(["ln", "-s", str(secret), "/tmp/link"])
        with pytest.raises(orchard.PathNotFoundError):
            sandbox.read_file("/tmp/link")
        with pytest.raises(orchard.PathError):
            sandbox.read_file("/../../" + str(secret))
    finally:
        secret.unlink()


def _layer_digest(path_in_image: str) -> str:
    digest = hashlib.sha256()
    for layer in sorted(IMAGES_DIR.glob(f"*/layers/*{path_in_image}")):
        digest.update(layer.read_bytes())
    return digest.hexdigest()


def test_image_layers_are_not_written(stack: Stack) -> None:
    before = _layer_digest("/etc/os-release")
    with _create(stack) as sb:
        assert sb.exec("echo tampered > /etc/os-release && rm -f /usr/bin/git").exit_code == 0
        assert sb.exec("cat /etc/os-release").stdout == b"tampered\n"
        with _create(stack) as neighbour:
            assert b"Debian" in neighbour.exec("cat /etc/os-release").stdout
            assert neighbour.exec(["git", "--version"]).exit_code == 0
    assert _layer_digest("/etc/os-release") == before
    assert any(IMAGES_DIR.glob("*/layers/*/usr/bin/git"))


def test_policy_none_has_no_network(sandbox: Sandbox, stack: Stack) -> None:
    r = sandbox.exec("ls /sys/class/net")
    assert r.stdout_text.split() == ["lo"]
    port = int(stack.endpoint.rsplit(":", 1)[1])
    probe = f"""
import socket
for host, port in [("127.0.0.1", {port}), ("{_host_address()}", {port}), ("1.1.1.1", 53)]:
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, port)); print("reached", host)
    except OSError as e:
        print("refused", host, e.errno)
"""
    out = sandbox.exec(["python3", "-c", probe], timeout=20).stdout_text
    assert "reached" not in out, out
    assert out.count("refused") == 3, out


def _host_address() -> str:
    """A non-loopback address of the host (never contacted from the host itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # UDP connect sends nothing; it only picks a route
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.2"


def test_memory_bomb_is_oom_killed(stack: Stack, sandbox: Sandbox) -> None:
    with _create(stack, memory="64Mi") as sb:
        r = sb.exec(["python3", "-c", "b = bytearray(512 << 20); print(len(b))"], timeout=60)
        assert r.status.oom_killed, r
        assert r.status.signal == 9 and r.exit_code != 0
        # The sandbox itself survives and keeps serving.
        assert sb.exec("echo alive").stdout == b"alive\n"
    assert sandbox.exec("echo neighbour").stdout == b"neighbour\n"


def test_fork_bomb_hits_the_pids_limit(stack: Stack, sandbox: Sandbox) -> None:
    with _create(stack, pids=64) as sb:
        events = sandbox_cgroup("pids", sb.id) / "pids.events"
        # The top shell forks once (a subshell that starts the bomb, before the box is
        # full) then becomes `sleep` without forking again, so the command lasts
        # until its timeout whatever the bomb does; the timeout must then kill
        # every process the bomb made.
        r = sb.exec("bomb() { bomb | bomb & }; (bomb) & exec sleep 30", timeout=5)
        assert r.status.timed_out, r
        hits = int(events.read_text().split()[1])
        assert hits > 0, "the pids limit was never reached"
        # The timeout killed the whole tree: the sandbox is usable again.
        assert sb.exec("echo alive", timeout=20).stdout == b"alive\n"
        left = sb.exec("ls -d /proc/[0-9]*").stdout_text.split()
        assert len(left) < 10, left
    assert sandbox.exec("echo neighbour").stdout == b"neighbour\n"


def _nice_of(pid: int | str) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_cpu_is_shared_by_tenant_and_the_control_plane_goes_first(
    stack: Stack, sandbox: Sandbox
) -> None:
    """The sandbox's cgroup is in its tenant's group, at the default weight once started;
    its commands run at nice 0 while ``orchard up``'s services run at -10 (their
    sessions too, where the kernel groups tasks by session)."""
    cpu = sandbox_cgroup("cpu", sandbox.id)
    assert cpu.parent.name == "t-dev" and cpu.parent.parent.name == "orchard"
    assert (cpu / "cpu.shares").read_text().strip() == "1024"  # the start-up boost is over
    in_sandbox = sandbox.exec(["sh", "-c", "cut -d ' ' -f 19 /proc/self/stat"])
    assert in_sandbox.stdout == b"0\n", in_sandbox
    services = Path(f"/proc/{stack.process.pid}/task/{stack.process.pid}/children")
    children = services.read_text().split()
    assert len(children) >= 3
    for pid in children:
        assert _nice_of(pid) == -10, pid
        autogroup = Path(f"/proc/{pid}/autogroup")
        if autogroup.exists():
            assert autogroup.read_text().split()[-1] == "-10", autogroup.read_text()
