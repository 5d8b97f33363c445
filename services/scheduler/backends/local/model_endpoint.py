"""The model endpoint: a listener on a sandbox's own loopback that reaches the model proxy.

A harness in a sandbox (Codex, Claude Code, OpenClaw, ...) must call its
session's recording proxy (``orchard.modelproxy``), and nothing else of the node,
whatever the sandbox's network policy, ``none`` (only ``lo``) included. A sandbox
created with ``model_endpoint`` gets a listening socket at ``127.0.0.1:7711``
*inside its own network namespace*; every connection accepted there is relayed by
this process to the model proxy's address, and only there. Commands see
``ORCHARD_MODEL_BASE=http://127.0.0.1:7711``.

Why this design (three were weighed):

- **A listener the node creates in the sandbox's namespace** (this module). The
  local backend already knows the sandbox's init; a dedicated thread ``setns``\\ es
  into its namespace, makes the socket and comes back (``orchard.common.netns``,
  shared with the executor's port forwarding); bind, listen, accept and the relay
  then run on the scheduler's event loop beside the egress proxy. No route, no
  interface, no nft rule and no address of the node appears in the sandbox: the
  only thing it can do is connect to that one port, and the only thing at the other
  end is a connection this process opens to the one configured address. It works
  for every policy (every namespace has ``lo``) and for both runc runtime classes
  (``runc`` and ``injected``: the container's namespace is a host namespace).
- *A veth and an nft rule that lets the sandbox reach the proxy's host port*: it
  would give policy-``none`` sandboxes an interface and a route, and put the
  node's address one rule away from the sandbox, the boundary issue 12 closes.
- *orchard-init listening and relaying over its control socket*: a new request kind
  in the C init and a byte stream multiplexed over the socket every exec uses, to
  gain nothing the node cannot do itself in microseconds.

Why in the scheduler's local backend and not the node executor: the endpoint
belongs to the sandbox's lifecycle (open before create returns, closed at delete,
reopened when a restarted scheduler lists the node, as network policies are), and
the backend runs each step of that already; the executor serves data-plane calls
and learns of a sandbox only when one names it.

What does not have one: ``runsc`` (gVisor's network stack lives in its Sentry; a
socket made in the host namespace the sandbox runs in is not on the loopback the
sandbox's processes see), refused at create with INVALID_ARGUMENT / UNSUPPORTED;
the Kubernetes backend (no capability: refused the same way; see
docs/model-endpoint.md for what the chart lacks).

Hostile sandboxes, and what holds:

- the target is the operator's, never the sandbox's: ``$ORCHARD_MODEL_ENDPOINT_TARGET``
  or the URL in ``<home>/run/modelproxy.addr`` (read when it changes, so the
  proxy ``orchard up`` starts after the scheduler, and restarts, is found); bytes
  are relayed unread, so what the sandbox reaches is the proxy's HTTP surface,
  whose session credentials and API keys judge it;
- the listener is bound before any process of the sandbox runs, without
  ``SO_REUSEPORT``, so nothing inside can take the port or share it;
- caps: connections open at once per sandbox, per tenant and for the node
  (``netpolicy.shares.Shares``, as the egress proxy); past one the connection is
  answered ``429`` naming the cap and the sandbox's listener pauses for
  ``REFUSAL_PAUSE_SECONDS`` before accepting again, so a connect flood costs the
  scheduler a few refusals a second, not a busy loop; a connection that moves no
  byte either way for ``idle_seconds`` is closed;
- bytes are counted per sandbox and direction (the log line when its endpoint
  closes, and ``orchard_model_endpoint_bytes_total`` on the scheduler's /metrics).

When the proxy serves HTTPS (``orchard up --tls``), this process speaks TLS to it,
trusting ``$ORCHARD_MODEL_ENDPOINT_CA`` (default ``<home>/run/ca.pem``), and the
endpoint inside stays plain HTTP: the sandbox needs no CA, and the bytes it sends
never leave the node unencrypted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import socket
import ssl
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
from prometheus_client import Counter

from orchard.common.log_throttle import LogThrottle
from orchard.common.netns import NetnsBroken, NetnsGone, NetnsSockets, SharesNodeNetns

from ..base import MODEL_ENDPOINT_ENV, MODEL_ENDPOINT_HOST, MODEL_ENDPOINT_PORT, BackendError
from ..netpolicy.relay import Activity, relay
from ..netpolicy.settings import positive_numbers_from_env
from ..netpolicy.shares import Shares

log = structlog.get_logger("orchard.scheduler.model_endpoint")

MARK_FILE = "model-endpoint"
"""In the sandbox's folder: it was created with an endpoint (reopened after a restart)."""
BACKLOG = 64
REFUSAL_PAUSE_SECONDS = 0.05
CONNECTIONS = Counter(
    "orchard_model_endpoint_connections_total",
    "Connections accepted on sandboxes' model endpoints, by outcome",
    ["outcome"],
)
BYTES = Counter(
    "orchard_model_endpoint_bytes_total",
    "Bytes relayed between sandboxes' model endpoints and the model proxy",
    ["direction"],
)
_RELAYED = CONNECTIONS.labels("relayed")
_REFUSED = CONNECTIONS.labels("refused_cap")
_UNREACHABLE = CONNECTIONS.labels("proxy_unreachable")
_UP = BYTES.labels("to_proxy")
_DOWN = BYTES.labels("to_sandbox")
# Lines a sandbox causes at will (every refused connection): a few per sandbox a minute.
SANDBOX_LINES = LogThrottle(every_seconds=60.0, burst=3)

_ENV = {
    "max_connections": "ORCHARD_MODEL_ENDPOINT_MAX_CONNECTIONS",
    "max_connections_per_tenant": "ORCHARD_MODEL_ENDPOINT_MAX_CONNECTIONS_PER_TENANT",
    "max_connections_node": "ORCHARD_MODEL_ENDPOINT_MAX_CONNECTIONS_NODE",
    "idle_seconds": "ORCHARD_MODEL_ENDPOINT_IDLE_SECONDS",
}


@dataclass(frozen=True)
class ModelEndpointSettings:
    target: str = ""
    """The model proxy: ``http://host:port``, ``https://host:port`` or ``host:port``;
    "" = the URL in ``<home>/run/modelproxy.addr`` (``orchard up`` writes it)
    ($ORCHARD_MODEL_ENDPOINT_TARGET)."""
    ca_file: Path | None = None
    """The CA an ``https`` proxy's certificate is checked against; None =
    ``<home>/run/ca.pem`` ($ORCHARD_MODEL_ENDPOINT_CA)."""
    max_connections: int = 64
    """Connections one sandbox may have open through its endpoint
    ($ORCHARD_MODEL_ENDPOINT_MAX_CONNECTIONS)."""
    max_connections_per_tenant: int = 512
    """... all of one tenant's sandboxes on the node
    ($ORCHARD_MODEL_ENDPOINT_MAX_CONNECTIONS_PER_TENANT)."""
    max_connections_node: int = 2048
    """... the whole node, two fds each ($ORCHARD_MODEL_ENDPOINT_MAX_CONNECTIONS_NODE)."""
    idle_seconds: float = 660.0
    """A connection that moves no byte either way this long is closed; above the proxy's
    600 s upstream timeout, so an unstreamed slow answer still arrives
    ($ORCHARD_MODEL_ENDPOINT_IDLE_SECONDS)."""
    connect_seconds: float = 10.0
    """To connect to the proxy."""

    def __post_init__(self) -> None:
        caps = [self.max_connections, self.max_connections_per_tenant, self.max_connections_node]
        if min(caps) < 1 or caps != sorted(caps):
            raise ValueError(
                "model endpoint caps: 1 <= per sandbox <= per tenant <= node is needed (got "
                f"{', '.join(map(str, caps))}; {', '.join(list(_ENV.values())[:3])})"
            )
        if self.target:
            parse_target(self.target)  # a bad value stops the start, naming the variable

    @classmethod
    def from_env(cls) -> ModelEndpointSettings:
        values = positive_numbers_from_env(cls, _ENV)
        ca = os.environ.get("ORCHARD_MODEL_ENDPOINT_CA", "").strip()
        target = os.environ.get("ORCHARD_MODEL_ENDPOINT_TARGET", "").strip()
        try:
            return cls(target=target, ca_file=Path(ca) if ca else None, **values)  # type: ignore[arg-type]
        except ValueError as err:
            if target and "ORCHARD_" not in str(err):
                raise ValueError(f"ORCHARD_MODEL_ENDPOINT_TARGET: {err}") from None
            raise


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    tls: bool

    def __str__(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"


def parse_target(text: str) -> Target:
    """``http(s)://host:port[/]`` or ``host:port``; ValueError naming what is wrong."""
    raw = text.strip()
    url = urlsplit(raw if "://" in raw else f"http://{raw}")
    if url.scheme not in ("http", "https") or url.path not in ("", "/") or url.query:
        raise ValueError(f"{raw[:200]!r} is not http(s)://host:port")
    try:
        port = url.port
    except ValueError:
        port = None
    if not url.hostname or port is None or not 1 <= port <= 65535:
        raise ValueError(f"{raw[:200]!r} names no host and port")
    return Target(url.hostname, port, url.scheme == "https")


class TargetMissing(Exception):
    """No model proxy is configured or announced (yet)."""


class ProxyTarget:
    """Where the relay connects: the setting, or the address file re-read when it changes."""

    def __init__(self, settings: ModelEndpointSettings, run_dir: Path) -> None:
        self._fixed = parse_target(settings.target) if settings.target else None
        self._file = run_dir / "modelproxy.addr"
        self._ca = settings.ca_file or run_dir / "ca.pem"
        self._seen: tuple[tuple[int, int, int], Target] | None = None
        self._tls: tuple[int, ssl.SSLContext] | None = None

    def current(self) -> Target:
        if self._fixed is not None:
            return self._fixed
        try:
            st = os.stat(self._file)
        except OSError:
            raise TargetMissing(
                f"no model proxy is running on this node ({self._file} is missing)"
            ) from None
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._seen is None or self._seen[0] != signature:
            try:
                target = parse_target(self._file.read_text())
            except (OSError, ValueError) as err:
                raise TargetMissing(f"unreadable {self._file}: {err}") from None
            self._seen = (signature, target)
        return self._seen[1]

    def tls_context(self) -> ssl.SSLContext:
        """Trusting the CA file (re-read when it changes)."""
        try:
            mtime = os.stat(self._ca).st_mtime_ns
        except OSError:
            raise TargetMissing(f"the model proxy speaks TLS and {self._ca} is missing") from None
        if self._tls is None or self._tls[0] != mtime:
            self._tls = (mtime, ssl.create_default_context(cafile=str(self._ca)))
        return self._tls[1]


@dataclass
class EndpointStats:
    """One sandbox's endpoint so far."""

    connections: int = 0
    """Relayed (accepted and under the caps)."""
    refused: int = 0
    """Answered 429 at a cap."""
    unreachable: int = 0
    """Answered 502/503: no proxy to relay to."""
    bytes_to_proxy: int = 0
    bytes_to_sandbox: int = 0
    open: int = 0


@dataclass
class _Held:
    """An accepted connection, until a stream transport owns it."""

    conn: socket.socket | None


@dataclass
class _Endpoint:
    sandbox_id: str
    tenant: str
    listener: socket.socket
    stats: EndpointStats = field(default_factory=EndpointStats)
    accepting: asyncio.Task[None] | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class ModelEndpoints:
    """Every model endpoint of the node's sandboxes; only touched on the event loop."""

    def __init__(self, settings: ModelEndpointSettings, run_dir: Path) -> None:
        self.settings = settings
        self.target = ProxyTarget(settings, run_dir)
        self.connections = Shares(
            settings.max_connections,
            settings.max_connections_per_tenant,
            settings.max_connections_node,
            "open model endpoint connections",
        )
        self._sockets: NetnsSockets | None = None
        self._open: dict[str, _Endpoint] = {}

    def is_open(self, sandbox_id: str) -> bool:
        return sandbox_id in self._open

    def stats(self, sandbox_id: str) -> EndpointStats | None:
        endpoint = self._open.get(sandbox_id)
        return None if endpoint is None else endpoint.stats

    async def open(self, sandbox_id: str, init_pid: int, rootfs: Path, tenant: str) -> None:
        """Listen at 127.0.0.1:7711 inside the sandbox (whose init is ``init_pid``)."""
        if sandbox_id in self._open:
            return
        if self._sockets is None:
            self._sockets = NetnsSockets()
        try:
            sock = await self._sockets.socket_for(init_pid, rootfs)
        except (NetnsGone, SharesNodeNetns, NetnsBroken, OSError) as err:
            raise BackendError.failure(f"model endpoint of {sandbox_id}: {err}") from None
        try:
            # A restarted scheduler reopens the endpoint while the connections its
            # predecessor accepted may still be in TIME_WAIT: without SO_REUSEADDR that
            # bind fails with EADDRINUSE (it never lets two listeners share the port).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((MODEL_ENDPOINT_HOST, MODEL_ENDPOINT_PORT))
            sock.listen(BACKLOG)
        except OSError as err:
            sock.close()
            raise BackendError.failure(
                f"model endpoint of {sandbox_id}: cannot listen on "
                f"{MODEL_ENDPOINT_HOST}:{MODEL_ENDPOINT_PORT} inside: {err.strerror or err}"
            ) from None
        endpoint = _Endpoint(sandbox_id, tenant or f"sandbox:{sandbox_id}", sock)
        endpoint.accepting = asyncio.ensure_future(self._accept(endpoint))
        self._open[sandbox_id] = endpoint

    async def close(self, sandbox_id: str) -> EndpointStats | None:
        """Stop listening and end every relayed connection; the endpoint's totals."""
        endpoint = self._open.pop(sandbox_id, None)
        if endpoint is None:
            return None
        tasks = [t for t in (endpoint.accepting, *endpoint.tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        endpoint.listener.close()
        stats = endpoint.stats
        log.info(
            "model endpoint closed",
            sandbox_id=sandbox_id,
            connections=stats.connections,
            refused=stats.refused,
            unreachable=stats.unreachable,
            bytes_to_proxy=stats.bytes_to_proxy,
            bytes_to_sandbox=stats.bytes_to_sandbox,
        )
        return stats

    async def close_all(self) -> None:
        for sandbox_id in list(self._open):
            await self.close(sandbox_id)
        if self._sockets is not None:
            self._sockets.close()
            self._sockets = None

    async def _accept(self, endpoint: _Endpoint) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _peer = await loop.sock_accept(endpoint.listener)
            except OSError as err:  # EMFILE and the like: wait, do not spin
                _sandbox_line(endpoint, "model endpoint accept failed", error=str(err))
                await asyncio.sleep(REFUSAL_PAUSE_SECONDS)
                continue
            conn.setblocking(False)
            refusal = self.connections.acquire(endpoint.sandbox_id, endpoint.tenant)
            if refusal is not None:
                endpoint.stats.refused += 1
                _REFUSED.inc()
                _sandbox_line(endpoint, "model endpoint connection refused", why=refusal)
                self._spawn(endpoint, _refuse(conn, 429, "MODEL_ENDPOINT_FULL", refusal))
                await asyncio.sleep(REFUSAL_PAUSE_SECONDS)
                continue
            endpoint.stats.open += 1
            held = _Held(conn)
            task = self._spawn(endpoint, self._serve(endpoint, held))
            # A callback, not a finally: it runs even for a task cancelled before it started.
            task.add_done_callback(functools.partial(self._release, endpoint, held))

    def _release(self, endpoint: _Endpoint, held: _Held, _task: object = None) -> None:
        if held.conn is not None:  # not handed to a transport (which closes it itself)
            held.conn.close()
        endpoint.stats.open -= 1
        self.connections.release(endpoint.sandbox_id, endpoint.tenant)

    @staticmethod
    def _spawn(endpoint: _Endpoint, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        endpoint.tasks.add(task)
        task.add_done_callback(endpoint.tasks.discard)
        return task

    async def _serve(self, endpoint: _Endpoint, held: _Held) -> None:
        stats = endpoint.stats
        conn = held.conn
        assert conn is not None
        try:
            target = self.target.current()
            context = self.target.tls_context() if target.tls else None
            upstream_r, upstream_w = await asyncio.wait_for(
                asyncio.open_connection(target.host, target.port, ssl=context),
                self.settings.connect_seconds,
            )
        except (TargetMissing, OSError, TimeoutError, ssl.SSLError) as err:
            stats.unreachable += 1
            _UNREACHABLE.inc()
            missing = isinstance(err, TargetMissing)
            why = str(err) if missing else f"cannot reach the model proxy: {err or 'timeout'}"
            _sandbox_line(endpoint, "model endpoint: no proxy", error=why)
            code = "MODEL_PROXY_NOT_RUNNING" if missing else "MODEL_PROXY_UNREACHABLE"
            await _refuse(conn, 503 if missing else 502, code, why)
            return
        stats.connections += 1
        _RELAYED.inc()
        held.conn = None
        try:
            client_r, client_w = await asyncio.open_connection(sock=conn)
        except BaseException:
            conn.close()
            upstream_w.close()
            raise
        activity = Activity()
        try:
            await relay(
                client_r, client_w, upstream_r, upstream_w, self.settings.idle_seconds, activity
            )
        except (TimeoutError, OSError):
            pass  # idle, or a side reset: both ends are closed below
        finally:
            stats.bytes_to_proxy += activity.up
            stats.bytes_to_sandbox += activity.down
            _UP.inc(activity.up)
            _DOWN.inc(activity.down)
            upstream_w.close()
            client_w.close()


_REASONS = {429: "Too Many Requests", 502: "Bad Gateway", 503: "Service Unavailable"}


async def _refuse(conn: socket.socket, status: int, code: str, message: str) -> None:
    """An HTTP answer in the proxy's error shape, then close (the request is not read)."""
    body = json.dumps(
        {"error": {"message": f"orchard model endpoint: {message}", "type": "error", "code": code}}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        + ("Retry-After: 1\r\n" if status == 429 else "")
        + "\r\n"
    )
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(5):
            await loop.sock_sendall(conn, head.encode() + body)
            conn.shutdown(socket.SHUT_WR)
            # Let the client's request arrive and be dropped, so the close is not a reset
            # that could destroy the answer before the client read it.
            while await loop.sock_recv(conn, 65536):
                pass
    conn.close()


def _sandbox_line(endpoint: _Endpoint, event: str, **fields: str) -> None:
    suppressed = SANDBOX_LINES.allow((event, endpoint.sandbox_id))
    if suppressed is not None:
        log.warning(event, sandbox_id=endpoint.sandbox_id, suppressed=suppressed, **fields)


def mark(sandbox_dir: Path) -> None:
    """Remember in the sandbox's folder that it has an endpoint (for a restarted scheduler)."""
    (sandbox_dir / MARK_FILE).write_text(f"{MODEL_ENDPOINT_ENV}\n")


def marked(sandbox_dir: Path) -> bool:
    return (sandbox_dir / MARK_FILE).exists()
