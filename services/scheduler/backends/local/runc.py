"""Running the runc CLI, and reading its state dir without running it.

``runc run --detach`` needs the sandbox's listening socket as *its* fd 3
(``--preserve-fds 1`` hands fds 3.. to the container). A multi-threaded parent
cannot dup2 onto its own fd 3 safely, so runc is started with
``os.posix_spawn`` and a DUP2 file action: the child gets the socket at fd 3,
the parent's fds stay as they are, and no Python code runs between fork and
exec. These calls block; the backend runs them in worker threads.

State is read straight from ``<root>/<id>/state.json`` (a few hundred
microseconds) instead of ``runc state`` (a process each): liveness is the init
pid existing with the start time runc recorded, so a recycled pid never
counts.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..base import BackendError

ERROR_TAIL = 2000


@dataclass(frozen=True)
class ContainerState:
    sandbox_id: str
    init_pid: int
    running: bool
    init_start_time: str = ""
    """The init's start time (/proc/<pid>/stat field 22) as runc recorded it."""


class Runc:
    def __init__(self, binary: str, root: Path) -> None:
        found = shutil.which(binary)
        if found is None:
            raise BackendError.failure(f"runc binary {binary!r} not found")
        self.binary = found
        self.root = root

    def _argv(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.root), *args]

    def run_detached(
        self, sandbox_id: str, bundle: Path, listen_fd: int, pid_file: Path, log_file: Path
    ) -> int:
        """Start the container with ``listen_fd`` as its fd 3; returns the init's host pid.

        The container's stdout and stderr (and runc's own errors) go to ``log_file``.
        """
        argv = self._argv(
            "run",
            "--detach",
            "--bundle",
            str(bundle),
            "--pid-file",
            str(pid_file),
            "--preserve-fds",
            "1",
            sandbox_id,
        )
        null_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            pid = os.posix_spawn(
                self.binary,
                argv,
                _runc_env(),
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, null_fd, 0),
                    (os.POSIX_SPAWN_DUP2, log_fd, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2),
                    (os.POSIX_SPAWN_DUP2, listen_fd, 3),
                ],
            )
        finally:
            os.close(null_fd)
            os.close(log_fd)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            raise BackendError.failure(f"runc run {sandbox_id} failed ({code}): {_tail(log_file)}")
        try:
            return int(pid_file.read_text().strip())
        except (OSError, ValueError) as err:
            raise BackendError.failure(f"runc run {sandbox_id}: no pid file: {err}") from err

    def delete(self, sandbox_id: str, *, force: bool = True) -> None:
        """``runc delete [--force]``: (kill the container and) remove its cgroups and state.

        ``--force`` on a running container polls for its death every 100 ms;
        :func:`kill_and_wait` first makes that wait unnecessary.
        """
        args = ["delete", "--force", sandbox_id] if force else ["delete", sandbox_id]
        proc = subprocess.run(
            self._argv(*args),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            env=_runc_env(),
        )
        if proc.returncode != 0 and self.state_dir(sandbox_id).exists():
            raise BackendError.failure(
                f"runc delete {sandbox_id} failed ({proc.returncode}): "
                f"{proc.stderr.strip()[-ERROR_TAIL:]}"
            )

    def state_dir(self, sandbox_id: str) -> Path:
        return self.root / sandbox_id

    def container_ids(self) -> list[str]:
        try:
            return sorted(
                entry.name for entry in os.scandir(self.root) if entry.is_dir(follow_symlinks=False)
            )
        except FileNotFoundError:
            return []

    def state(self, sandbox_id: str) -> ContainerState | None:
        """The container's state from runc's state dir; None when runc has no such container."""
        try:
            with open(self.state_dir(sandbox_id) / "state.json", "rb") as src:
                data = json.load(src)
        except FileNotFoundError:
            return (
                None
                if not self.state_dir(sandbox_id).exists()
                else ContainerState(sandbox_id, 0, False)
            )
        except (OSError, ValueError):
            return ContainerState(sandbox_id, 0, False)
        pid = int(data.get("init_process_pid") or 0)
        start = str(data.get("init_process_start") or "")
        running = pid > 0 and process_start_time(pid) == start
        return ContainerState(sandbox_id, pid if running else 0, running, start if running else "")


def kill_and_wait(pid: int, start_time: str, timeout: float = 5.0) -> bool:
    """SIGKILL the process ``pid`` (if it is still the one that started at ``start_time``)
    and wait until it has exited; False if it is still there after ``timeout``.

    A pidfd pins the process, so a recycled pid is never signalled; killing a
    pid namespace's init makes the kernel kill everything else in it too.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        if process_start_time(pid) != start_time:
            return True  # the pid now belongs to someone else; ours is gone
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(int(timeout * 1000)))
    finally:
        os.close(pidfd)


def process_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks); None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as src:
            stat = src.read().decode("ascii", "replace")
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ESRCH):
            return None
        raise
    # The command name (field 2) may contain spaces and parentheses.
    after_comm = stat[stat.rfind(")") + 2 :].split()
    if not after_comm or after_comm[0] == "Z":
        return None
    return after_comm[19]


def _runc_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as src:
            src.seek(0, os.SEEK_END)
            size = src.tell()
            src.seek(max(0, size - ERROR_TAIL))
            return src.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
