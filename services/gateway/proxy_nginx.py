"""The nginx data-plane proxy's configuration: one generated nginx.conf per home.

Why nginx: a data-plane call through the gateway's Python proxy (``proxy.py``)
costs ~0.6 ms more than a direct one, and one Python gRPC hop alone costs
~0.45 ms (loadtest/bench_grpc_hop.py), so the issue's 0.3 ms needs the hop
outside Python. nginx's ``grpc_pass`` moves HTTP/2 frames in C.

What it forwards, and where: only ``/orchard.v1.ExecutorService/*`` paths, and
only to the node executor(s) named here (a fixed upstream; nothing a client
sends chooses the upstream, so nginx cannot be steered elsewhere). Anything
else is answered with gRPC UNIMPLEMENTED by nginx itself. In the local backend
one node executor serves every runc sandbox, so there is one upstream. The
call's ``authorization: Bearer <data-plane token>`` and ``grpc-timeout`` pass
through untouched: the executor verifies the token against the request's own
sandbox id end to end (nginx checks nothing), and enforces the deadline.
Sandboxes whose executor is their own (injected runtimes) are not reachable
through nginx; they keep the gateway's Python proxy.

Streams: request bodies are never buffered by grpc_pass and
``client_max_body_size 0`` lifts the size cap (file streams of any size).
Timeouts (:class:`NginxTimeouts`): short before a request reaches the executor
(10 s for the preface and headers, 75 s idle with no stream, 1 h per connection),
so a client that authenticates nothing cannot hold connections; long (24 h) on
an open stream, because the executor authenticates and bounds idle streams
itself (``stream_idle_seconds``) and a silent long exec is legitimate. A client that resets its stream makes nginx drop the upstream
stream, which the executor sees as a cancellation.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# Spelled out, not read from the stubs: the wrapper that runs nginx stays a small process
# (importing protobuf would triple its RSS); a test checks it against executor.proto.
EXECUTOR_SERVICE = "orchard.v1.ExecutorService"
# nginx closes a client connection after this many requests; gRPC clients keep one connection.
MAX_REQUESTS_PER_CONNECTION = 100_000_000


@dataclass(frozen=True)
class NginxTimeouts:
    """How long nginx holds a client connection in each phase, and why each bound.

    Before the executor has seen a request nothing about the client is known (nginx
    checks no token), so those phases are short: an unauthenticated client cannot hold a
    connection (an fd and a slot of ``worker_connections``) for long by sending nothing,
    or headers a byte at a time. Once a stream reaches the executor, the executor
    authenticates it at once (unary calls, and streams at their first message, which it
    waits for at most ``stream_idle_seconds``) and bounds idle request streams itself,
    while a silent exec (a long build, ``sleep``) is legitimate, so stream phases are long.
    """

    header_seconds: int = 10
    """``client_header_timeout``: the HTTP/2 preface and a request's headers must arrive
    within this (a client sends them in one round trip); on HTTP/2 it also bounds a frame
    left half sent."""
    idle_seconds: int = 75
    """``keepalive_timeout``: a connection with no stream open is closed (HTTP/2 GOAWAY)
    after this; a gRPC client reconnects on its next call, transparently."""
    connection_seconds: int = 3600
    """``keepalive_time``: no new stream is accepted on a connection older than this
    (GOAWAY once its streams end; open streams are not cut), so pings or a trickle of
    requests do not keep one connection forever."""
    stream_seconds: int = 24 * 3600
    """``client_body_timeout``, ``send_timeout``, ``grpc_read_timeout``,
    ``grpc_send_timeout``: silence on an open stream, in either direction; longer than
    a silent exec we expect (the executor bounds idle request streams itself)."""

    def __post_init__(self) -> None:
        for name in ("header_seconds", "idle_seconds", "connection_seconds", "stream_seconds"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"nginx timeout {name} must be at least 1 second")


@dataclass(frozen=True)
class NginxTLS:
    """TLS for the nginx proxy: plain paths (no grpc or ssl import: the wrapper stays small).

    Either side may be on alone: ``cert_file``/``key_file`` make nginx serve TLS to clients
    (``client_ca_file`` also requires their certificates); ``upstream_ca_file`` makes it dial
    the executors with TLS (``grpcs://``), verifying their certificate against that CA and
    ``upstream_name`` (nginx checks DNS names only: a loopback executor's certificate must
    also name ``localhost``) and presenting its own certificate when it has one."""

    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None
    upstream_ca_file: Path | None = None
    upstream_name: str = "localhost"

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("nginx TLS needs both a certificate and its key")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("a client CA needs a server certificate and key")
        for path in (self.cert_file, self.key_file, self.client_ca_file, self.upstream_ca_file):
            if path is not None:
                _path_ok(path)
        if not self.upstream_name or any(c in self.upstream_name for c in " ;{}'\"\n\\"):
            raise ValueError(f"not a host name: {self.upstream_name!r}")

    @property
    def serves_tls(self) -> bool:
        return self.cert_file is not None

    @property
    def upstream_tls(self) -> bool:
        return self.upstream_ca_file is not None


def _path_ok(path: Path) -> str:
    text = str(path)
    if not path.is_absolute() or any(c in text for c in " ;{}'\"\n\\$"):
        raise ValueError(f"not a plain absolute path for nginx.conf: {text!r}")
    return text


def _server_tls(tls: NginxTLS) -> str:
    if tls.cert_file is None or tls.key_file is None:
        return ""
    lines = [
        f"ssl_certificate {_path_ok(tls.cert_file)};",
        f"ssl_certificate_key {_path_ok(tls.key_file)};",
        "ssl_protocols TLSv1.2 TLSv1.3;",
        "ssl_session_cache shared:orchard_tls:1m;",
    ]
    if tls.client_ca_file is not None:
        lines += [
            f"ssl_client_certificate {_path_ok(tls.client_ca_file)};",
            "ssl_verify_client on;",
        ]
    return "".join(f"        {line}\n" for line in lines)


def _upstream_tls(tls: NginxTLS) -> str:
    if tls.upstream_ca_file is None:
        return ""
    lines = [
        f"grpc_ssl_trusted_certificate {_path_ok(tls.upstream_ca_file)};",
        "grpc_ssl_verify on;",
        "grpc_ssl_verify_depth 2;",
        f"grpc_ssl_name {tls.upstream_name};",
        "grpc_ssl_server_name on;",
        "grpc_ssl_protocols TLSv1.2 TLSv1.3;",
        "grpc_ssl_session_reuse on;",
    ]
    if tls.cert_file is not None and tls.key_file is not None:
        lines += [
            f"grpc_ssl_certificate {_path_ok(tls.cert_file)};",
            f"grpc_ssl_certificate_key {_path_ok(tls.key_file)};",
        ]
    return "".join(f"            {line}\n" for line in lines)


class NginxMissingError(RuntimeError):
    """``--data-plane-proxy nginx`` was asked for and there is no nginx binary."""


def nginx_binary(explicit: str | None = None) -> str:
    """The nginx executable (``explicit``, else ``$ORCHARD_NGINX``, else ``nginx`` on PATH or
    /usr/sbin/nginx), or NginxMissingError; a named binary that is not there is not replaced."""
    named = explicit or os.environ.get("ORCHARD_NGINX")
    candidates = [named] if named else [shutil.which("nginx"), "/usr/sbin/nginx"]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return candidate
    raise NginxMissingError(
        (f"no nginx binary at {named!r} ($ORCHARD_NGINX): " if named else "")
        + "the nginx data-plane proxy needs the nginx binary (Debian: apt-get install nginx, "
        "or `make system-deps`); pass --data-plane-proxy python to use the gateway's Python proxy"
    )


@dataclass(frozen=True)
class NginxPaths:
    """Where one home's nginx keeps its config, pid, logs and temporary files."""

    root: Path
    """``<home>/run/nginx``."""
    logs: Path
    """``<home>/logs``."""

    @property
    def conf(self) -> Path:
        return self.root / "nginx.conf"

    @property
    def pid(self) -> Path:
        return self.root / "nginx.pid"

    @property
    def temp(self) -> Path:
        return self.root / "temp"

    @property
    def error_log(self) -> Path:
        return self.logs / "data-plane-nginx.error.log"

    def create(self) -> None:
        self.temp.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)


def _address_ok(address: str) -> str:
    """``address`` as host:port, refusing anything that could break out of the directive."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host or any(c in host for c in " ;{}'\"\n\\"):
        raise ValueError(f"not a host:port address: {address!r}")
    return address


def render_conf(
    listen: str,
    executors: list[str],
    paths: NginxPaths,
    tls: NginxTLS | None = None,
    timeouts: NginxTimeouts | None = None,
) -> str:
    """nginx.conf text: one foreground nginx process, HTTP/2 on ``listen``,
    ExecutorService paths passed to ``executors`` (round robin; one in the local backend);
    ``tls`` turns TLS on towards clients and/or towards the executors."""
    tls = tls or NginxTLS()
    limits = timeouts or NginxTimeouts()
    if not executors:
        raise ValueError("at least one executor address is needed")
    servers = "\n".join(f"        server {_address_ok(a)} max_fails=0;" for a in executors)
    temp = paths.temp
    t = limits.stream_seconds
    return f"""# Generated by `orchard up --data-plane-proxy nginx` (services/gateway/proxy_nginx.py).
# Rewritten at every start; edits are lost.
daemon off;
# One process, no master: killed, it leaves no orphaned worker holding the port, so the
# supervisor's restart can bind it again (a master's workers outlive a SIGKILLed master).
master_process off;
worker_processes 1;
pid {paths.pid};
error_log {paths.error_log} warn;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
    client_body_temp_path {temp}/client_body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;

    # Short before a request reaches the executor (no token is checked yet), long on an
    # open stream (the executor authenticated it; silent execs are legitimate): see
    # NginxTimeouts. File streams of any size.
    client_header_timeout {limits.header_seconds}s;
    keepalive_timeout {limits.idle_seconds}s;
    keepalive_time {limits.connection_seconds}s;
    reset_timedout_connection on;
    client_max_body_size 0;
    client_body_timeout {t}s;
    send_timeout {t}s;
    keepalive_requests {MAX_REQUESTS_PER_CONNECTION};
    http2_max_concurrent_streams 1024;
    http2_chunk_size 16k;

    upstream orchard_executors {{
{servers}
        keepalive 64;
        keepalive_requests {MAX_REQUESTS_PER_CONNECTION};
        keepalive_timeout 3600s;
    }}

    server {{
        listen {_address_ok(listen)}{" ssl" if tls.serves_tls else ""} http2;
{_server_tls(tls)}
        location /{EXECUTOR_SERVICE}/ {{
            grpc_pass {"grpcs" if tls.upstream_tls else "grpc"}://orchard_executors;
{_upstream_tls(tls)}            grpc_connect_timeout 5s;
            grpc_read_timeout {t}s;
            grpc_send_timeout {t}s;
            grpc_socket_keepalive on;
            grpc_buffer_size 64k;
            # An upstream that is down or restarting: UNAVAILABLE, so clients retry.
            error_page 502 503 504 = @unavailable;
        }}

        location @unavailable {{
            default_type application/grpc;
            add_header grpc-status 14 always;
            add_header grpc-message "node executor unreachable through the data-plane proxy" always;
            return 204;
        }}

        # Only the data plane is served here; the control plane is the gateway's.
        location / {{
            default_type application/grpc;
            add_header grpc-status 12 always;
            add_header grpc-message "only orchard.v1.ExecutorService is served on the data-plane proxy" always;
            return 204;
        }}
    }}
}}
"""


def write_conf(
    listen: str,
    executors: list[str],
    paths: NginxPaths,
    tls: NginxTLS | None = None,
    timeouts: NginxTimeouts | None = None,
) -> Path:
    """Write ``nginx.conf`` under ``paths.root`` and return it."""
    paths.create()
    paths.conf.write_text(render_conf(listen, executors, paths, tls, timeouts))
    return paths.conf
