"""What a runsc (gVisor) sandbox has on the host, read with /proc and the filesystem.

A runsc sandbox is more than one process: ``runsc-gofer``, ``runsc-sandbox``
(the Sentry) and the ptrace stubs, plus runsc's state and lock files under
``<home>/run/runsc``. These probes find them without asking the backend, so a
test can tell whether delete really removed them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

RUNSC_PROCESSES = (b"runsc-gofer", b"runsc-sandbox", b"runsc")


def runsc_root(home: Path) -> Path:
    return home / "run" / "runsc"


def runsc_pids(home: Path, sandbox_id: str) -> list[int]:
    """Host pids of runsc processes of this home's runsc root working for ``sandbox_id``
    (its id or bundle folder on their command line)."""
    root_flag = os.fsencode(f"--root={runsc_root(home)}")
    mine = (os.fsencode(sandbox_id), os.fsencode(f"/sandboxes/{sandbox_id}"))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/cmdline", "rb") as src:
                args = src.read().split(b"\0")
            ours = any(arg == mine[0] or arg.endswith(mine[1]) for arg in args)
            if args and args[0] in RUNSC_PROCESSES and root_flag in args and ours:
                found.append(int(entry))
    return found


def runsc_state_files(home: Path, sandbox_id: str) -> list[str]:
    root = runsc_root(home)
    if not root.is_dir():
        return []
    return sorted(str(root / n) for n in os.listdir(root) if n.startswith(f"{sandbox_id}_"))


def force_delete_runsc(home: Path) -> None:
    """Test clean-up of last resort: ``runsc delete --force`` every container of this home."""
    root = runsc_root(home)
    if not root.is_dir() or shutil.which("runsc") is None:
        return
    ids = {n.partition("_sandbox:")[0] for n in os.listdir(root) if "_sandbox:" in n}
    for sandbox_id in sorted(ids):
        subprocess.run(
            ["runsc", "--root", str(root), "delete", "--force", sandbox_id],
            capture_output=True,
            check=False,
            timeout=30,
        )
