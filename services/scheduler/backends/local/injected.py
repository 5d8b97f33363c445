"""The injected runtime on the local backend: each sandbox runs its own executor.

The same mechanism as a Kubernetes pod: the executor bundle (built by
``python -m orchard.executor.bundle build``) is bind-mounted read-only at
``/.orchard/bundle``, and the container's process is the bundle's
``orchard-entry``, which starts the bundled executor and then execs the
bundled orchard-init as pid 1. Nothing of the image is used or changed: the
mount points live in the sandbox's overlay upper dir, never in a layer.

The host side of the sandbox folder gets ``run/`` (0700; in a user namespace owned
by the sandbox's root, the range's first host uid, as are the files below the
backend writes and init.sock), bind-mounted at ``/.orchard/run``. It is a tmpfs of
its own, a few MiB and inodes (``run_folder.py``), so what the sandbox's root writes
there is capped and never reaches the host's disk:

    run/init.sock       orchard-init's socket (bound on the host, handed in as fd 3)
    run/sandbox.json    the sandbox as the executor inside sees it (init pid 1, its
                        own memory cgroup path)
    run/token.key       this sandbox's own token keys (derived from the node's, one
                        per key id: they verify its tokens and no other sandbox's);
                        the executor reads the file and removes it before any
                        sandbox code can run
    run/executor.sock   where the executor serves (``unix:`` address for the host)
    run/executor.addr   written by the executor once it serves: the readiness signal
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchard.common.layout import SandboxLayout, SandboxMeta

from ..base import BackendError
from . import run_folder

BUNDLE_IN_CONTAINER = "/.orchard/bundle"
RUN_IN_CONTAINER = "/.orchard/run"
EXECUTOR_SOCKET = "executor.sock"
READY_FILE = "executor.addr"
TOKEN_KEY_FILE = "token.key"
META_FILE = "sandbox.json"
INIT_SOCKET = "init.sock"
ENTRY = "bin/orchard-entry"
BUNDLE_MANIFEST = "bundle.json"
# cgroup v1: the sandbox's memory cgroup as it appears inside (cgroup namespace).
MEMORY_CGROUP_IN_CONTAINER = "/sys/fs/cgroup/memory"
LOG_TAIL = 2000


def run_dir(sandbox: SandboxLayout) -> Path:
    return sandbox.dir / "run"


def executor_address(sandbox: SandboxLayout) -> str:
    """The gRPC address the host (or a client on it) reaches the sandbox's executor at."""
    return f"unix:{run_dir(sandbox) / EXECUTOR_SOCKET}"


def check_bundle(bundle: Path) -> Path:
    """The bundle folder, resolved, if it looks built; else a clear failure."""
    entry = bundle / ENTRY
    if not (bundle / BUNDLE_MANIFEST).is_file() or not os.access(entry, os.X_OK):
        raise BackendError.failure(
            f"executor bundle {bundle} is missing or incomplete "
            "(`python -m orchard.executor.bundle build` builds it and prints its path)"
        )
    return bundle.resolve()


@dataclass(frozen=True)
class InjectedRuntime:
    """One sandbox's injected executor: its mounts, process and run folder."""

    bundle: Path
    sandbox: SandboxLayout

    @property
    def run_dir(self) -> Path:
        return run_dir(self.sandbox)

    @property
    def init_socket(self) -> Path:
        return self.run_dir / INIT_SOCKET

    def process_args(self, init_fd: int | None) -> list[str]:
        """The container's process; ``init_fd`` None: orchard-init binds run/init.sock inside."""
        args = [
            f"{BUNDLE_IN_CONTAINER}/{ENTRY}",
            "--run-dir",
            RUN_IN_CONTAINER,
            "--listen",
            f"unix:{RUN_IN_CONTAINER}/{EXECUTOR_SOCKET}",
        ]
        return args if init_fd is None else [*args, "--init-fd", str(init_fd)]

    def mounts(self, *, cgroupfs: bool = True) -> list[dict[str, Any]]:
        """The bundle and run folder; ``cgroupfs``: also the host's cgroups, read-only
        (gVisor refuses that mount: a runsc sandbox's executor goes without)."""
        mounts = [
            {
                "destination": BUNDLE_IN_CONTAINER,
                "type": "bind",
                "source": str(self.bundle),
                "options": ["rbind", "ro", "nosuid", "nodev"],
            },
            {
                "destination": RUN_IN_CONTAINER,
                "type": "bind",
                "source": str(self.run_dir),
                "options": ["bind", "rw", "nosuid", "nodev", "noexec"],
            },
        ]
        if cgroupfs:
            # The executor reads its memory cgroup's oom_kill counter here.
            mounts.append(
                {
                    "destination": "/sys/fs/cgroup",
                    "type": "cgroup",
                    "source": "cgroup",
                    "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
                }
            )
        return mounts

    def prepare(self, meta: SandboxMeta, token_keys: bytes, owner: int | None = None) -> None:
        """Make run/ with what the executor inside reads at start; ``owner``: the host uid
        (and gid) of the sandbox's root in its user namespace, which then owns run/ and
        its files (the executor runs as that root; host root stays outside the range).
        run/ is a capped tmpfs (``run_folder.py``: the sandbox's root writes there), mounted
        here first; delete unmounts it."""
        run_folder.mount(self.run_dir, owner)
        _inside(meta).write(self.run_dir / META_FILE)
        fd = os.open(
            self.run_dir / TOKEN_KEY_FILE,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
            0o600,
        )
        with os.fdopen(fd, "wb") as out:
            out.write(token_keys)
        if owner is not None:
            for path in (self.run_dir, self.run_dir / META_FILE, self.run_dir / TOKEN_KEY_FILE):
                os.chown(path, owner, owner)

    def update_env(self, meta: SandboxMeta) -> None:
        """Rewrite what the executor inside starts commands with from the host's own
        sandbox.json ``meta`` (already merged), never from run/'s copy: run/ belongs to
        the sandbox's root, who may have put a FIFO (a read blocks for good) or a
        symlink to a host file there. The new file is owned like run/."""
        _write_owned(self.run_dir / META_FILE, _inside(meta), os.stat(self.run_dir).st_uid)

    def wait_ready(self, init_pid: int, log_file: Path, timeout: float) -> None:
        """Return once the executor serves; a clear failure if it dies or takes too long."""
        ready = self.run_dir / READY_FILE
        deadline = time.monotonic() + timeout
        delay = 0.002
        while not ready.exists():
            if not _alive(init_pid):
                raise BackendError.failure(
                    f"the injected executor's sandbox exited during start: {_tail(log_file)}"
                )
            if time.monotonic() > deadline:
                raise BackendError.failure(
                    f"the injected executor did not serve within {timeout:g} s: {_tail(log_file)}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _inside(meta: SandboxMeta) -> SandboxMeta:
    """The sandbox as its executor sees it: init is pid 1, its memory cgroup is inside."""
    return SandboxMeta(
        sandbox_id=meta.sandbox_id,
        env=meta.env,
        memory_cgroup=MEMORY_CGROUP_IN_CONTAINER,
        init_pid=1,
        cwd=meta.cwd,
    )


def _write_owned(path: Path, meta: SandboxMeta, owner: int) -> None:
    """Write ``meta`` to ``path`` atomically (a new inode, 0600, owned by ``owner`` before
    it takes the name), in a folder the sandbox's root can write: the temp name is made
    O_EXCL | O_NOFOLLOW, so a symlink planted there is refused, never followed, and the
    rename replaces whatever (FIFO, symlink) is at ``path`` without opening it."""
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(tmp, flags, 0o600), "w", encoding="utf-8") as out:
        os.fchown(out.fileno(), owner, owner)
        out.write(meta.to_json())
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    """The pid exists and is not a zombie (a dead init stays one until runc reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _tail(log_file: Path) -> str:
    try:
        return log_file.read_text(errors="replace")[-LOG_TAIL:].strip() or "(no output)"
    except OSError:
        return "(no log)"
