"""Notice a local sandbox whose init died behind the scheduler's back.

A sandbox's orchard-init is its pid 1: when it dies (kill -9 from the host, an
OOM kill of the whole cgroup) the kernel kills everything in the sandbox and
the sandbox is useless, but its container, mounts and cgroups stay until
someone deletes them. The scheduler's reaper asks the backend every pass
(``failure``); this answers from ``/proc/<pid>/stat`` alone once it has seen
the init running: the first look parses runc's state (pid and start time), and
later looks compare the start time, so a pass over 1000 sandboxes costs 1000
small reads, not 1000 JSON parses, and a recycled pid is never taken for the
init.
"""

from __future__ import annotations

from collections.abc import Callable

from ..base import BackendError
from .runc import ContainerState, process_start_time

INIT_EXITED = "INIT_EXITED"


class InitWatch:
    """Which sandboxes' inits are still the processes that started them."""

    def __init__(self, state: Callable[[str], ContainerState | None]) -> None:
        self._state = state
        self._inits: dict[str, tuple[int, str]] = {}

    def failure(self, sandbox_id: str) -> BackendError | None:
        """Why the sandbox can no longer run commands, or None while its init runs."""
        known = self._inits.get(sandbox_id)
        if known is not None:
            pid, start = known
            if process_start_time(pid) == start:
                return None
            del self._inits[sandbox_id]
            return self._died(sandbox_id)
        state = self._state(sandbox_id)
        if state is not None and state.running and state.init_start_time:
            self._inits[sandbox_id] = (state.init_pid, state.init_start_time)
            return None
        return self._died(sandbox_id)

    def forget(self, sandbox_id: str) -> None:
        """The sandbox was deleted: drop what is known about it."""
        self._inits.pop(sandbox_id, None)

    @staticmethod
    def _died(sandbox_id: str) -> BackendError:
        return BackendError(
            INIT_EXITED,
            f"sandbox {sandbox_id}: its init (pid 1) is no longer running; "
            "every process in it was killed (fault: infrastructure)",
        )
