"""Settings of the node executor: a small frozen dataclass with defaults that work on one machine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchard.common.layout import NodeLayout

MIB = 1 << 20


@dataclass(frozen=True)
class ExecutorSettings:
    home: Path
    """Node home (layout.NodeLayout): sandboxes/, run/ and secrets/token.key live here."""
    listen: str = "127.0.0.1:0"
    """Where ExecutorService listens; port 0 picks a free one (see run/executor.addr)."""
    max_output_bytes: int = 16 * MIB
    """Per-stream output cap when a request says 0: keeps a flood from eating memory."""
    output_bytes_ceiling: int = 256 * MIB
    """The largest per-stream cap a request may ask for."""
    max_receive_message_bytes: int = 64 * MIB
    """Largest request message (a Run's whole stdin, a file chunk)."""
    stream_idle_seconds: float = 300.0
    """A request stream that sends nothing for this long (before its first
    message, or between WriteFile/Upload chunks) is ended with
    DEADLINE_EXCEEDED and its resources freed; an Exec's stdin is not bounded
    (the command's own timeout is). ``$ORCHARD_STREAM_IDLE_SECONDS``."""
    small_messages_per_second: float = 1000.0
    """Per-stream pace of request messages under 4 KiB (stream_bounds.py); 0 = unpaced
    (``$ORCHARD_SMALL_MESSAGES_PER_SECOND``)."""
    max_small_messages_per_stream: int = 16384
    """A WriteFile/Upload stream sending more messages under 4 KiB is refused with
    RESOURCE_EXHAUSTED (``$ORCHARD_MAX_SMALL_MESSAGES``; 0 = no cap)."""
    shutdown_grace_seconds: float = 5.0
    """How long in-flight calls get to finish on shutdown."""
    in_sandbox_run_dir: Path | None = None
    """Injected mode: the executor runs inside the one sandbox it serves, whose
    sandbox.json, init.sock and executor.addr are in this folder (``/.orchard/run``);
    None = node mode (every sandbox under ``home``)."""
    token_key: bytes | None = None
    """Injected mode: what ``run/token.key`` held, already read (the executor reads it and
    removes the file before any sandbox code can run): this sandbox's own token keys;
    None = node mode (the node's keyring, ``secrets/token-keys.json``)."""

    @property
    def layout(self) -> NodeLayout:
        return NodeLayout(self.home)

    @property
    def address_file(self) -> Path:
        """Where the bound address is written once the server listens."""
        if self.in_sandbox_run_dir is not None:
            return self.in_sandbox_run_dir / "executor.addr"
        return self.layout.run / "executor.addr"
