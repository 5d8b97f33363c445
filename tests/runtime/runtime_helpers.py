"""Host-side probes for the runtime tests: what exists on the machine for a sandbox.

These look at the machine with plain host tools and /proc (never through the
backend), so a test can tell whether the backend really made or removed
something.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchard.scheduler.backends.local import cgroups, overlay
from orchard.scheduler.backends.local.runc import process_start_time

from tests.cgroup_paths import sandbox_cgroup_dirs
from tests.network.leftovers import network_leftovers

NAMESPACES = ("pid", "mnt", "net", "uts", "ipc", "cgroup")
INIT_MAGIC = 0x4F524331


def ns_link(pid: int | str, ns: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{ns}")


def kernel_at_least(major: int, minor: int) -> bool:
    """Whether this machine's kernel is ``major.minor`` or newer (from ``uname -r``)."""
    release = os.uname().release.split("-", 1)[0].split(".")
    return (int(release[0]), int(release[1])) >= (major, minor)


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this mount namespace."""
    prefix = str(path)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as mountinfo:
        for line in mountinfo:
            target = line.split(" ")[4]
            if target == prefix or target.startswith(prefix + "/"):
                found.append(target)
    return found


def processes_in_netns(link: str) -> list[int]:
    """Host pids whose network namespace is ``link`` (e.g. "net:[4026532181]")."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/net") == link:
                    pids.append(int(entry))
    return pids


def _in_another_sandbox(pid: int, sandbox_id: str) -> bool:
    """Whether ``pid`` runs in another sandbox's cgroup: the kernel reuses a freed network
    namespace's inode number, so a neighbour's sandbox made after this one was deleted (a
    parallel test) can show the same ``net:[...]`` link."""
    try:
        groups = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    return "orchard" in groups and sandbox_id not in groups


def cgroup_dirs(sandbox_id: str) -> list[str]:
    return sandbox_cgroup_dirs(sandbox_id)


@dataclass(frozen=True)
class Footprint:
    """What a running sandbox has on the host, recorded to check that delete removes it."""

    sandbox_id: str
    home: Path
    init_pid: int
    init_start: str
    netns: str

    @classmethod
    def of(cls, home: Path, sandbox_id: str, init_pid: int) -> Footprint:
        start = process_start_time(init_pid)
        assert start is not None, "init is not running"
        return cls(sandbox_id, home, init_pid, start, ns_link(init_pid, "net"))

    def leftovers(self) -> list[str]:
        """Everything of the sandbox still on the machine (empty when fully deleted)."""
        left = []
        if process_start_time(self.init_pid) == self.init_start:
            left.append(f"init pid {self.init_pid} still running")
        sandbox_dir = self.home / "sandboxes" / self.sandbox_id
        left += [f"mount {m}" for m in mounts_under(sandbox_dir)]
        left += [f"cgroup {c}" for c in cgroup_dirs(self.sandbox_id)]
        left += [
            f"netns user pid {p}"
            for p in processes_in_netns(self.netns)
            if not _in_another_sandbox(p, self.sandbox_id)
        ]
        left += network_leftovers(self.sandbox_id)  # veth, nft chains/sets, address lease
        if sandbox_dir.exists():
            left.append(f"folder {sandbox_dir}")
        state = self.home / "run" / "runc" / self.sandbox_id
        if state.exists():
            left.append(f"runc state {state}")
        return left


def nsenter(pid: int, *argv: str, input_text: str | None = None) -> str:
    """Run ``argv`` inside every namespace of ``pid`` (test-only; the product uses init)."""
    proc = subprocess.run(
        ["nsenter", "-t", str(pid), "-a", *argv],
        capture_output=True,
        text=True,
        check=True,
        input=input_text,
        timeout=30,
    )
    return proc.stdout


def init_exec(sock_path: Path, argv: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Run one command through orchard-init's protocol v1; returns (exit code, stdout)."""
    strings = b"".join(
        s.encode() + b"\0" for s in ["/", *argv, *(f"{k}={v}" for k, v in env.items())]
    )
    body = struct.pack("<7I", INIT_MAGIC, 0, 0, 0, 10_000, len(argv), len(env)) + strings
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(20)
        conn.connect(_short_socket_path(sock_path))
        conn.sendall(struct.pack("<I", len(body)) + body)
        msg, fds, _flags, _addr = socket.recv_fds(conn, 64, 8)
        try:
            if msg[:1] != b"S":
                raise AssertionError(f"init refused the command: {msg!r}")
            stdout_fd = fds[0]
            out = b""
            while chunk := os.read(stdout_fd, 65536):
                out += chunk
        finally:
            for fd in fds:
                os.close(fd)
        rest = msg[5:]
        while len(rest) < 18:
            chunk = conn.recv(64)
            if not chunk:
                break
            rest += chunk
        assert rest[:1] == b"X", f"no exit message: {rest!r}"
        (code,) = struct.unpack("<i", rest[1:5])
        return code, out


def _short_socket_path(path: Path) -> str:
    # Test homes are short, but be safe with long ones.
    return str(path) if len(str(path)) < 100 else os.path.relpath(path)


def force_cleanup_home(home: Path) -> None:
    """Remove every container, mount and cgroup under a test home, then the home itself.

    The last line of defence behind the backend's own delete: uses runc and
    umount directly, so a broken backend cannot leave a test's mess behind.
    """
    runc_root = home / "run" / "runc"
    ids: set[str] = set()
    if runc_root.is_dir():
        ids.update(os.listdir(runc_root))
    if (home / "sandboxes").is_dir():
        ids.update(os.listdir(home / "sandboxes"))
    for sandbox_id in sorted(ids):
        subprocess.run(
            ["runc", "--root", str(runc_root), "delete", "--force", sandbox_id],
            capture_output=True,
            check=False,
        )
    for target in sorted(mounts_under(home), key=len, reverse=True):
        with contextlib.suppress(OSError):
            overlay.unmount_overlay(Path(target))
    for sandbox_id in ids:
        with contextlib.suppress(OSError):
            cgroups.remove_sandbox_cgroups(sandbox_id, attempts=5)
    shutil.rmtree(home, ignore_errors=True)
