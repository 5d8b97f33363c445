"""Settings of the node executor: a small frozen dataclass with defaults that work on one machine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchard.common.layout import NodeLayout
from orchard.common.tls import ServerTLS

from .shares import ShareLimits

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
    output_bytes_per_sandbox: int = 512 * MIB
    """Memory for command output the executor holds for one sandbox's calls at once
    (output_budget.py: a buffered byte counts four times, for its copies); a call whose
    output does not fit is refused (``$ORCHARD_OUTPUT_MIB_PER_SANDBOX``)."""
    output_bytes_per_tenant: int = 1024 * MIB
    """The same for all of one tenant's sandboxes (``$ORCHARD_OUTPUT_MIB_PER_TENANT``)."""
    output_bytes_node: int = 2048 * MIB
    """The same for the whole node: the bound of the executor's output memory
    (``$ORCHARD_OUTPUT_MIB_NODE``)."""
    output_bytes_per_second_per_tenant: int = 64 * MIB
    """Pace of reading one tenant's command output (output_budget.OutputPace): past it,
    its pipes wait, so a flood cannot take the loop every call shares; 0 = unpaced
    (``$ORCHARD_OUTPUT_MIB_PER_SECOND_PER_TENANT``)."""
    output_pace_burst_bytes: int = 32 * MIB
    """Output a tenant may have read at once before the pace applies."""
    sessions_per_sandbox: int = 32
    """Live shell sessions one sandbox may hold (``$ORCHARD_SESSIONS_PER_SANDBOX``)."""
    sessions_per_tenant: int = 512
    """Live shell sessions one tenant may hold on this node (``$ORCHARD_SESSIONS_PER_TENANT``)."""
    sessions_node: int = 4096
    """Live shell sessions of the whole node."""
    port_connections_per_sandbox: int = 64
    """Forwarded TCP connections (ConnectPort, ports.py) one sandbox may hold open at once
    (``$ORCHARD_PORT_CONNECTIONS_PER_SANDBOX``): each is a socket and an HTTP/2 stream."""
    port_connections_per_tenant: int = 512
    """The same for all of one tenant's sandboxes (``$ORCHARD_PORT_CONNECTIONS_PER_TENANT``)."""
    port_connections_node: int = 4096
    """The same for the whole node (``$ORCHARD_PORT_CONNECTIONS_NODE``): below its fd limit."""
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
    tls: ServerTLS | None = None
    """Serve TLS on a TCP ``listen`` (``--tls-cert``/``--tls-key``/``--tls-client-ca`` or
    ``$ORCHARD_TLS_CERT``/``$ORCHARD_TLS_KEY``/``$ORCHARD_TLS_CLIENT_CA``): data-plane tokens
    then never cross the network in the clear. The certificate must be valid for the address
    the scheduler hands out (its ``--executor-address``; ``--executor-tls`` tells clients).
    None = plaintext; ``unix:`` sockets are always plaintext."""

    processes_per_sandbox: int = 64
    """Running background processes and terminals one sandbox may hold
    (``$ORCHARD_PROCESSES_PER_SANDBOX``); RESOURCE_EXHAUSTED past it."""
    processes_per_tenant: int = 1024
    """The same for all of one tenant's sandboxes on this node."""
    processes_node: int = 8192
    """The same for the whole node."""
    process_buffer_bytes: int = 1 * MIB
    """Output a background process keeps for readers (both streams; background.py):
    past it the oldest bytes are dropped and a reader is told how many
    (``$ORCHARD_PROCESS_BUFFER_KIB``). Charged to the output shares above."""
    finished_processes_kept: int = 32
    """Finished processes whose result and output are kept per sandbox (oldest forgotten first)."""
    finished_process_seconds: float = 600.0
    """How long a finished process's result is kept (``$ORCHARD_FINISHED_PROCESS_SECONDS``)."""

    @property
    def process_shares(self) -> ShareLimits:
        return ShareLimits(
            self.processes_per_sandbox, self.processes_per_tenant, self.processes_node
        )

    @property
    def output_shares(self) -> ShareLimits:
        return ShareLimits(
            self.output_bytes_per_sandbox, self.output_bytes_per_tenant, self.output_bytes_node
        )

    @property
    def session_shares(self) -> ShareLimits:
        return ShareLimits(self.sessions_per_sandbox, self.sessions_per_tenant, self.sessions_node)

    @property
    def port_shares(self) -> ShareLimits:
        return ShareLimits(
            self.port_connections_per_sandbox,
            self.port_connections_per_tenant,
            self.port_connections_node,
        )

    @property
    def layout(self) -> NodeLayout:
        return NodeLayout(self.home)

    @property
    def address_file(self) -> Path:
        """Where the bound address is written once the server listens."""
        if self.in_sandbox_run_dir is not None:
            return self.in_sandbox_run_dir / "executor.addr"
        return self.layout.run / "executor.addr"
