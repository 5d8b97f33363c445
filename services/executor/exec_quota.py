"""ExecSlots: a tenant's concurrent-exec quota, enforced where execs happen.

The quota comes from the call's verified token (``tokens.TokenClaims``:
``tenant`` and ``max_execs``, signed by the control plane), which
``auth.CallAuthorizer.check`` leaves in :data:`CALL_CLAIMS` for the call. A
command (Run, Exec, SessionRun) holds one slot of its tenant for as long as it
runs; one past ``max_execs`` is RESOURCE_EXHAUSTED / QUOTA_EXCEEDED with a
short ``retry-after`` (commands end all the time, so a slot frees soon).
Counting is per tenant over every sandbox on this executor, in-process: the
event loop makes check-and-increment one step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from orchard.common.errors import quota_exceeded
from orchard.common.metrics import count_quota_rejection
from orchard.common.tokens import TokenClaims

CALL_CLAIMS: ContextVar[TokenClaims | None] = ContextVar("orchard_call_claims", default=None)
EXEC_RETRY_AFTER_SECONDS = 0.1


class ExecSlots:
    def __init__(self) -> None:
        self._running: dict[str, int] = {}

    def running(self, tenant: str) -> int:
        return self._running.get(tenant, 0)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """One exec slot of the current call's tenant for the duration of the block."""
        claims = CALL_CLAIMS.get()
        if claims is None or claims.max_execs <= 0:
            yield
            return
        tenant = claims.tenant
        running = self._running.get(tenant, 0)
        if running >= claims.max_execs:
            count_quota_rejection("executor", tenant, "max_execs")
            raise quota_exceeded(
                f"tenant {tenant!r} already runs {running} commands (quota {claims.max_execs})",
                retry_after=EXEC_RETRY_AFTER_SECONDS,
            )
        self._running[tenant] = running + 1
        try:
            yield
        finally:
            left = self._running[tenant] - 1
            if left:
                self._running[tenant] = left
            else:
                del self._running[tenant]
