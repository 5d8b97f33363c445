"""Running gVisor's ``runsc`` CLI, and reading its state files without running it.

The ``runsc`` runtime class: the same OCI bundle as runc (overlay root,
cgroup limits under ``/orchard/<id>``), run by gVisor, so the sandbox's
processes talk to gVisor's user-space kernel (the Sentry, ptrace platform)
instead of the host's. Two differences shape how it is used here:

* runsc has no ``--preserve-fds``: a listening socket cannot be handed in as
  fd 3. So runsc sandboxes always run injected (``injected.py``): the
  executor runs inside and orchard-init binds ``/.orchard/run/init.sock``
  itself; the executor's own socket, bound inside on the bind-mounted run
  folder, becomes a real host socket because runsc runs with
  ``--host-uds=all``. (``create`` alone is not enough: orchard-entry's chmod
  of the socket it bound fails with EPERM. ``open`` lets the sandbox connect
  to host sockets on its gofer mounts, which are its own overlay root, the
  read-only bundle and its run folder: no socket there but its own.)
* runsc's network stack reads the network namespace once, at boot, so a veth
  added afterwards (how ``netpolicy`` attaches sandboxes) is never seen. runsc
  runs with ``--network=none`` (loopback only): policy ``none`` only.

Each sandbox is three kinds of host process (``runsc-gofer``,
``runsc-sandbox`` and its ptrace stubs), all in the sandbox's cgroups; state
lives in ``<root>/<id>_sandbox:<id>.state`` (JSON) beside a lock file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from ..base import BackendError
from .runc import ERROR_TAIL, ContainerState, _runc_env, _tail, process_start_time

GLOBAL_FLAGS = ("--network=none", "--host-uds=all")
STATE_SUFFIX = ".state"
LOCK_SUFFIX = ".lock"
SANDBOX_PROCESS = b"runsc-sandbox"
GOFER_PROCESS = b"runsc-gofer"


class Runsc:
    def __init__(self, binary: str, root: Path) -> None:
        self.binary = shutil.which(binary)
        """None when runsc is not installed: its state can still be read and swept."""
        self.wanted = binary
        self.root = root

    def check_available(self) -> None:
        """Refuse (client fault, UNSUPPORTED) the runtime class when runsc is not installed."""
        if self.binary is None:
            raise BackendError.invalid(
                f"runtime class 'runsc' needs gVisor's {self.wanted!r} binary on this node "
                "(Debian package runsc)",
                reason="UNSUPPORTED",
            )

    def _argv(self, *args: str) -> list[str]:
        self.check_available()
        return [str(self.binary), "--root", str(self.root), *GLOBAL_FLAGS, *args]

    def run_detached(self, sandbox_id: str, bundle: Path, pid_file: Path, log_file: Path) -> int:
        """``runsc run --detach``; returns the host pid of the sandbox (Sentry) process.

        The container's stdout and stderr (and runsc's own errors) go to ``log_file``.
        """
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        argv = self._argv(
            "run", "--detach", "--bundle", str(bundle), "--pid-file", str(pid_file), sandbox_id
        )
        with open(log_file, "ab") as log:
            proc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                check=False,
                env=_runc_env(),
            )
        if proc.returncode != 0:
            raise BackendError.failure(
                f"runsc run {sandbox_id} failed ({proc.returncode}): {_tail(log_file)}"
            )
        try:
            return int(pid_file.read_text().strip())
        except (OSError, ValueError) as err:
            raise BackendError.failure(f"runsc run {sandbox_id}: no pid file: {err}") from err

    def delete(self, sandbox_id: str) -> None:
        """``runsc delete --force``: kill the sandbox and gofer, remove cgroups and state."""
        proc = subprocess.run(
            self._argv("delete", "--force", sandbox_id),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            env=_runc_env(),
        )
        if proc.returncode != 0 and self.owns(sandbox_id):
            raise BackendError.failure(
                f"runsc delete {sandbox_id} failed ({proc.returncode}): "
                f"{proc.stderr.strip()[-ERROR_TAIL:]}"
            )

    def _state_file(self, sandbox_id: str) -> Path:
        return self.root / f"{sandbox_id}_sandbox:{sandbox_id}{STATE_SUFFIX}"

    def owns(self, sandbox_id: str) -> bool:
        """runsc has state (or a lock left by a create killed half-way) for this id."""
        return self._state_file(sandbox_id).exists() or self.lock_file(sandbox_id).exists()

    def lock_file(self, sandbox_id: str) -> Path:
        return self.root / f"{sandbox_id}_sandbox:{sandbox_id}{LOCK_SUFFIX}"

    def forget(self, sandbox_id: str) -> None:
        """Drop runsc's files for an id whose processes are gone (runsc could not delete it)."""
        for path in (self._state_file(sandbox_id), self.lock_file(sandbox_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def container_ids(self) -> list[str]:
        """Ids of the root containers runsc has state for (``<id>_sandbox:<id>.*``)."""
        ids: set[str] = set()
        try:
            entries = os.listdir(self.root)
        except FileNotFoundError:
            return []
        for name in entries:
            stem, dot, _ = name.rpartition(".")
            container, sep, sandbox = stem.partition("_sandbox:")
            if dot and sep and container == sandbox:
                ids.add(container)
        return sorted(ids)

    def host_processes(self, sandbox_id: str) -> list[tuple[int, str]]:
        """(pid, start time) of the sandbox's Sentry and gofer that are still running.

        Both are checked by command line (runsc records no start times), so a
        recycled pid is never reported.
        """
        try:
            with open(self._state_file(sandbox_id), "rb") as src:
                data: Any = json.load(src)
            pids = [
                (int(data["sandbox"]["pid"]), SANDBOX_PROCESS),
                (int(data["goferPid"]), GOFER_PROCESS),
            ]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        found = []
        for pid, name in pids:
            start = process_start_time(pid) if pid > 0 and _is_runsc(pid, name, self.root) else None
            if start is not None:
                found.append((pid, start))
        return found

    def state(self, sandbox_id: str) -> ContainerState | None:
        """The sandbox's state from runsc's state file; None when runsc has no such container.

        Running = the recorded Sentry pid exists and is a ``runsc-sandbox``
        process (runsc records no start time, so the command line guards
        against a recycled pid); its start time is read now for ``kill_and_wait``.
        """
        if not self.owns(sandbox_id):
            return None
        try:
            with open(self._state_file(sandbox_id), "rb") as src:
                data: Any = json.load(src)
            pid = int(data["sandbox"]["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return ContainerState(sandbox_id, 0, False)
        start = (
            process_start_time(pid)
            if pid > 0 and _is_runsc(pid, SANDBOX_PROCESS, self.root)
            else None
        )
        if start is None:
            return ContainerState(sandbox_id, 0, False)
        return ContainerState(sandbox_id, pid, True, start)


def _is_runsc(pid: int, name: bytes, root: Path) -> bool:
    """``pid`` is a runsc process called ``name`` working for the runsc root ``root``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as src:
            args = src.read().split(b"\0")
    except OSError:
        return False
    return bool(args) and args[0] == name and os.fsencode(f"--root={root}") in args
