"""Waits the integration checks share (imported in the side venvs too: SDK only)."""

from __future__ import annotations

import asyncio
import time

import orchard


async def gone(client: orchard.AsyncOrchard, sandbox_id: str) -> None:
    """Wait until a delete's background teardown has finished (state "deleted").

    Until then the executor still knows the sandbox while its root is being removed:
    an exec in that window can fail as the command's own start error (seen:
    "user 'nobody' does not exist") rather than as the sandbox being gone.
    """
    deadline = time.monotonic() + 30
    while (await client.sandboxes.connect(sandbox_id)).last_info.state != "deleted":
        assert time.monotonic() < deadline, f"{sandbox_id} was not deleted within 30 s"
        await asyncio.sleep(0.05)
