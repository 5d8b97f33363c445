"""KillAll: signal every process of a sandbox except its init.

A command can leave processes behind (``sleep 600 &``, a background fork
bomb) that hold the sandbox's pids and memory until it is deleted. orchard-init
(pid 1 of the sandbox's pid namespace) is the one process that must survive,
so the work is done there: a kill-all request to its socket makes a shim (or,
when the pids limit leaves no room for a shim, init itself) send the signal to
every other process in the namespace and, for SIGKILL, wait until they are
gone. Every runtime we start (local runc, runsc, the injected executor on
Kubernetes) has our init as pid 1, so there is no other path. The injected
executor lives in the sandbox it serves: it passes its own pid to be kept.
"""

from __future__ import annotations

import os
import signal as signals

from orchard.common.errors import infrastructure, invalid

from .init_client import InitUnavailable, kill_all
from .init_protocol import StartFailure, kill_all_request
from .sandboxes import Sandbox

MAX_SIGNAL = 64


def check_signal(signal: int) -> int:
    """The signal to send: 0 means SIGKILL; anything outside 1..64 is refused."""
    if signal == 0:
        return int(signals.SIGKILL)
    if not 1 <= signal <= MAX_SIGNAL:
        raise invalid(f"signal must be 1..{MAX_SIGNAL} (or 0 for SIGKILL), got {signal}")
    return signal


async def kill_all_processes(sandbox: Sandbox, signal: int, *, keep_self: bool) -> int:
    """How many processes ``signal`` was sent to; ``keep_self`` spares this
    executor (injected mode, where it is one of the sandbox's processes)."""
    request = kill_all_request(signal, os.getpid() if keep_self else 0)
    try:
        answer = await kill_all(sandbox.socket_path, request)
    except InitUnavailable as exc:
        raise infrastructure(f"lost the sandbox's init: {exc}", reason="SANDBOX_NOT_READY") from exc
    if isinstance(answer, StartFailure):
        raise infrastructure(
            f"the sandbox's init refused the kill-all (errno {answer.errno})",
            reason="SANDBOX_NOT_READY",
        )
    return answer
