"""Copy bytes both ways between two stream pairs, with an idle timeout and a byte count.

Shared by the egress proxy's tunnels and responses (``proxy``) and the model
endpoint's relay (``local.model_endpoint``): a tunnel is idle only when neither
direction moved a byte for ``idle`` seconds (a long answer streamed one way keeps
it open), and what moved is counted per direction on the :class:`Activity`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

RELAY_CHUNK = 64 * 1024


@dataclass
class Activity:
    """When a byte last moved either way, and how many moved each way."""

    last: float = field(default_factory=lambda: asyncio.get_running_loop().time())
    up: int = 0
    """Bytes from the client (the sandbox) to the upstream."""
    down: int = 0
    """Bytes from the upstream to the client."""


async def pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    activity: Activity,
    idle: float,
    *,
    upward: bool,
    write_eof: bool = True,
) -> None:
    """Copy until EOF, or until neither direction moved for ``idle`` seconds (TimeoutError)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data = await asyncio.wait_for(reader.read(RELAY_CHUNK), idle)
        except TimeoutError:
            if loop.time() - activity.last >= idle:
                raise
            continue
        if not data:
            break
        activity.last = loop.time()
        if upward:
            activity.up += len(data)
        else:
            activity.down += len(data)
        writer.write(data)
        await asyncio.wait_for(writer.drain(), idle)
    if write_eof and writer.can_write_eof():
        writer.write_eof()


async def relay(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream_r: asyncio.StreamReader,
    upstream_w: asyncio.StreamWriter,
    idle: float,
    activity: Activity | None = None,
) -> Activity:
    """Both directions until both end, or until the tunnel is idle (TimeoutError)."""
    activity = activity if activity is not None else Activity()
    down = asyncio.ensure_future(pipe(upstream_r, client_w, activity, idle, upward=False))
    try:
        with contextlib.suppress(OSError):
            await pipe(client_r, upstream_w, activity, idle, upward=True)
        await down
    finally:
        down.cancel()
    return activity
