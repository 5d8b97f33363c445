"""What the injected executor does before serving, inside the sandbox it serves.

The injected executor shares the sandbox with the code it runs (as root, by
default), so two things are done before any command can start:

- it makes itself non-dumpable, so /proc/<pid>/mem, ptrace and core dumps of
  the executor are closed to sandbox processes (they lack CAP_SYS_PTRACE);
- it reads the token key from the run folder and removes the file: the key
  would let sandbox code mint tokens, and no sandbox code runs before the
  executor serves (every command is started through it). Where the file
  cannot be removed (a read-only Kubernetes Secret volume) it says so in the
  log: the pod must then get a key of its own.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

TOKEN_KEY_FILE = "token.key"
MIN_KEY_BYTES = 32
PR_SET_DUMPABLE = 4


class InSandboxSetupError(RuntimeError):
    """The run folder does not hold what the injected executor needs."""


def make_non_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0) on this process (like orchard-init does)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise InSandboxSetupError(f"prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(err)}")


def take_token_key(path: Path) -> bytes:
    """Read the token key and remove its file (a warning on stderr if it cannot be removed)."""
    make_non_dumpable()
    try:
        key = path.read_bytes()
    except OSError as err:
        raise InSandboxSetupError(f"token key {path}: {err.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise InSandboxSetupError(f"token key {path} is shorter than {MIN_KEY_BYTES} bytes")
    try:
        path.unlink()
    except OSError as err:
        print(
            f"orchard executor: warning: could not remove the token key {path} "
            f"({err.strerror}); sandbox code can read it",
            file=sys.stderr,
            flush=True,
        )
    return key
