"""A dropped token key stops working in the local sandboxes that run their own executor.

``orchard token-key rotate --drop KID`` removes a key from the node's keyring
(``secrets/token-keys.json``); the node executor and the gateway re-read it. A
local *injected* or runsc sandbox's executor instead got its own derived keys
once, at creation (``run/token.key``, read and removed before sandbox code runs),
and kept them: a token signed with the dropped key (the leaked one, typically)
kept running commands there until it expired.

So the scheduler watches its keyring (every ``interval``; the keyring file is
re-read at most once a second) and, for each key id whose drop is new to it
(``Keyring.dropped``, which the keyring keeps, so a restarted scheduler tells
again: notices only remove keys, one told twice is harmless), sends every usable
sandbox with its own executor created before the drop a **key-drop notice**
(``TokenSigner.sign_key_drop``, through ``revocation_delivery`` like the
revocation notices), signed with that sandbox's own key of a key id that is
still live. Its executor forgets the dropped key, remembered tokens included.

- A create in flight (PENDING) at the drop is asked about again each pass until
  it is usable, then told.
- A sandbox that holds **no live key** (every key it got at creation is now
  dropped) cannot be told: a notice signed with the dropped key is refused by
  design (that key is what leaked), and it holds no other. It also cannot verify
  any token the scheduler issues from now on. It is deleted at once, with the
  reason on its record.
- A notice that cannot be delivered is retried every pass; a sandbox whose
  executor has not taken it for ``give_up_seconds`` is deleted, as for a
  revocation (``revocations.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from orchard.common.tokens import TokenSigner

from .revocation_delivery import NoticeDelivery, NoticeTarget, PassLoop, PassResult
from .revocations import ASKED_STATES
from .store import SandboxStore, State

log = structlog.get_logger("orchard.scheduler.key_drops")


class SandboxKeyDrops:
    """Tells the store's sandboxes with their own executor of the keyring's dropped keys."""

    def __init__(
        self,
        signer: TokenSigner,
        store: SandboxStore,
        remove: Callable[[str, str], Awaitable[None]],
        *,
        interval_seconds: float,
        give_up_seconds: float,
    ) -> None:
        self._signer = signer
        self._store = store
        self._remove = remove
        """(sandbox id, why): delete a sandbox that cannot be told."""
        self._delivery = NoticeDelivery(
            signer,
            give_up_seconds=give_up_seconds,
            sign=lambda t, _moment: signer.sign_key_drop(t.sandbox_id, t.tenant, created=t.created),
            what="key drop",
        )
        self._loop = PassLoop("key-drop-notices", self.push_once, interval_seconds)
        self._seen: dict[str, float] = {}
        """Dropped key id -> the drop every sandbox holding it has been told of."""
        self._again: set[str] = set()
        """Key ids with a sandbox not told yet: asked about again next pass."""

    @property
    def pushed(self) -> int:
        return self._delivery.pushed

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def push_once(self) -> PassResult:
        """One pass: tell every sandbox that needs it; delete those that cannot be told."""
        ring = self._signer.ring.ring()
        table = dict(ring.dropped)
        kids = {k for k, moment in table.items() if self._seen.get(k) != moment}
        kids |= self._again & table.keys()
        if not kids:
            return PassResult()
        again: set[str] = set()
        targets: list[NoticeTarget] = []
        untellable: dict[str, str] = {}
        for rec in self._store.find(states=ASKED_STATES):
            if not rec.executor_address and rec.state != State.PENDING:
                continue  # the node executor serves it, and reads the keyring itself
            for kid in sorted(kids):
                if rec.created_at >= table[kid]:
                    continue  # made after the drop: it was never given that key
                if rec.state == State.PENDING:
                    again.add(kid)  # its executor address is known once it is usable
                    continue
                if ring.live_kid_held(rec.created_at, besides=kid) is None:
                    untellable[rec.id] = kid
                    continue
                targets.append(NoticeTarget(rec.id, kid, rec.executor_address, rec.created_at))
        result = await self._delivery.deliver(table, targets)
        again.update(t.tenant for t in result.failed)
        for kid in kids:
            self._seen[kid] = table[kid]
        self._again = again
        self._delivery.forget(lambda _sandbox_id, kid: kid in again)
        for sandbox_id, kid in untellable.items():
            await self._give_up(
                sandbox_id,
                kid,
                f"every token key it holds is dropped (the last: {kid}): it cannot be told "
                "of the drop, nor verify a token of a live key",
            )
        for target in result.overdue:
            await self._give_up(
                target.sandbox_id,
                target.tenant,
                f"its executor did not take the drop of token key {target.tenant} "
                "(ExecutorService.Revoke failed past the give-up bound)",
            )
        return result

    async def _give_up(self, sandbox_id: str, kid: str, why: str) -> None:
        log.error("deleting a sandbox that cannot be told of a dropped token key",
                  sandbox_id=sandbox_id, kid=kid)  # fmt: skip
        await self._remove(sandbox_id, why)
