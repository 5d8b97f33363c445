"""``orchard up``: run the embedded default stack as three child processes.

Starts the node executor, the scheduler and the gateway (each ``python -m
orchard.<service>``), waits for each to print its address, prints the endpoint
and the dev API key file, writes ``<home>/run/gateway.addr`` (the gateway does),
and serves until Ctrl-C or SIGTERM. A child that dies meanwhile is restarted
on the same address, with backoff; one that crash-loops stops the whole stack
(``_supervision.RestartPolicy`` says when and why). Then it stops the gateway, the scheduler
(started with ``--delete-all-on-shutdown``, so every sandbox is deleted and
nothing is left behind) and the executor, in that order.

The rewards service (``orchard.rewards``) starts after the gateway, pointed at it;
it writes ``<home>/run/rewards.addr``. The recording model proxy (``orchard.modelproxy``,
``--model-upstream``) starts last and stops first; it writes ``<home>/run/modelproxy.addr``.

The children's logs go to ``<home>/logs/<service>.log``.

``--tls``: plaintext stays the default (loopback). With it, ``orchard up`` makes a
local CA and one server certificate under ``<home>/secrets/tls/`` (kept and reused;
``orchard.common.local_ca``), valid for localhost, the loopback addresses and
``--host``, and starts every service with it: the gateway's gRPC port and REST front,
the node executor (the scheduler tells clients with ``ExecutorAccess.tls``), the
nginx data-plane proxy (both sides), the rewards service and the model proxy (HTTPS).
Clients find the CA at
``<home>/run/ca.pem``, and the address files carry the scheme: ``run/gateway.addr``
is ``grpcs://host:port``, ``run/gateway-http.addr`` ``https://host:port``,
``run/data-plane.addr`` and ``run/rewards.addr`` ``grpcs://...``, ``run/modelproxy.addr``
``https://...``. The SDK trusts
``run/ca.pem`` when its endpoint comes from that home (``orchard.client._tls``).

Internal calls are always authenticated, ``--tls`` or not: before starting anything,
``orchard up`` issues the internal CA and the gateway's and the scheduler's certificates
under ``<home>/secrets/internal/`` (root's, 0700; ``orchard.common.internal_pki``), and the
scheduler serves mutual TLS that admits only the gateway's certificate
(``orchard.scheduler.callers``).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from orchard.client import OrchardError
from orchard.common.layout import NodeLayout, orchard_home
from orchard.executor.initbin import ensure_init_binary
from orchard.gateway.proxy_nginx import NginxMissingError, nginx_binary

from . import _extras
from ._supervision import RestartPolicy

READY_TIMEOUT_SECONDS = 60.0
DATA_PLANE_PROXIES = ("nginx", "python", "off")
DEFAULT_DATA_PLANE_PROXY = "python"
STOP_TIMEOUT_SECONDS = 60.0
DEFAULT_CONTROL_PLANE_NICE = -10
_TLS_ENV = (
    "ORCHARD_TLS_CERT",
    "ORCHARD_TLS_KEY",
    "ORCHARD_TLS_CLIENT_CA",
    "ORCHARD_TLS_UPSTREAM_CA",
)


def register(commands: Any) -> None:
    p = commands.add_parser("up", help="run the embedded default stack until Ctrl-C")
    p.add_argument(
        "--home",
        type=Path,
        default=None,
        help="node home (default $ORCHARD_HOME or /var/lib/orchard)",
    )
    p.add_argument("--host", default="127.0.0.1", help="gateway host (default 127.0.0.1)")
    p.add_argument(
        "--port", type=int, default=50051, help="gateway port (default 50051; 0 picks a free one)"
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="REST/JSON port (default 50080, or a free one with --port 0; -1: no REST front)",
    )
    p.add_argument(
        "--data-plane-proxy",
        choices=DATA_PLANE_PROXIES,
        default=os.environ.get("ORCHARD_DATA_PLANE_PROXY") or DEFAULT_DATA_PLANE_PROXY,
        help="who forwards ORCHARD_DATA_PLANE=proxy clients' exec/file calls: nginx (a C hop "
        "on its own port, run/data-plane.addr), python (the gateway itself), off "
        f"(default $ORCHARD_DATA_PLANE_PROXY or {DEFAULT_DATA_PLANE_PROXY})",
    )
    p.add_argument(
        "--data-plane-port",
        type=int,
        default=None,
        help="nginx data-plane proxy port (default 50052, or a free one with --port 0)",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="serve TLS everywhere with a local CA made under <home>/secrets/tls "
        "(clients trust <home>/run/ca.pem; endpoints become grpcs:// and https://)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=int(os.environ.get("ORCHARD_CONTROL_PLANE_NICE") or DEFAULT_CONTROL_PLANE_NICE),
        help="the control plane's CPU priority (nice, -20..19; default "
        f"$ORCHARD_CONTROL_PLANE_NICE or {DEFAULT_CONTROL_PLANE_NICE}): the services and the "
        "runc they start, not the sandboxes (their first process goes back to 0)",
    )
    p.add_argument(
        "--model-upstream",
        default=os.environ.get("ORCHARD_MODEL_UPSTREAM") or "",
        help="the inference server the recording model proxy forwards to (an OpenAI base URL; "
        "default $ORCHARD_MODEL_UPSTREAM; unset: the proxy refuses model calls)",
    )
    p.add_argument(
        "--model-proxy-port",
        type=int,
        default=None,
        help="recording model proxy port (default 50090, or a free one with --port 0; -1: none)",
    )
    p.set_defaults(run=cmd_up)


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    module: str = ""
    restart_args: list[str] = field(default_factory=list)
    """The arguments of a restart: the first start's, with the address it bound pinned."""
    policy: RestartPolicy = field(default_factory=RestartPolicy)


class StackError(OrchardError):
    """A child service failed to start or died."""


def _wait_ready(child: Child, log_path: Path) -> str:
    """The address the child prints once it serves (first stdout line)."""
    assert child.process.stdout is not None
    fd = child.process.stdout.fileno()
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    buffer = b""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StackError(
                f"{child.name} did not become ready in {READY_TIMEOUT_SECONDS:.0f} s (log: {log_path})"
            )
        readable, _, _ = select.select([fd], [], [], min(remaining, 0.5))
        if readable:
            data = os.read(fd, 4096)
            if not data:
                code = child.process.wait()
                raise StackError(
                    f"{child.name} exited with code {code} while starting (log: {log_path})"
                )
            buffer += data
    return buffer.split(b"\n", 1)[0].decode().strip()


def _start(
    name: str, module: str, args: list[str], home: Path, env: dict[str, str]
) -> tuple[Child, str]:
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    log = open(log_path, "ab")  # noqa: SIM115 (closed in _stop)
    process = subprocess.Popen(
        [sys.executable, "-m", module, "--home", str(home), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        start_new_session=True,  # Ctrl-C reaches only us; we stop the children in order
    )
    _session_priority(process.pid)
    child = Child(name, process, log, module, args)
    try:
        return child, _wait_ready(child, log_path)
    except BaseException:
        _stop(child)
        raise


def _stop(child: Child) -> None:
    if child.process.poll() is None:
        child.process.send_signal(signal.SIGTERM)
        try:
            child.process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            print(f"orchard: {child.name} did not stop in time; killing it", file=sys.stderr)
            child.process.kill()
            child.process.wait()
    if child.process.stdout is not None:
        child.process.stdout.close()
    child.log.close()


def _pinned(args: list[str], flag: str, address: str) -> list[str]:
    """``args`` with ``flag``'s value replaced by ``address`` (a restart binds the same port)."""
    out = list(args)
    out[out.index(flag) + 1] = address
    return out


def _restart(child: Child, home: Path, env: dict[str, str], stopping: Callable[[], bool]) -> Child:
    """Start ``child`` again after it died, waiting out its backoff; StackError when it crash-loops."""
    _stop(child)
    while True:
        delay = child.policy.crashed()
        if delay is None:
            raise StackError(
                f"{child.name} crashed {child.policy.recent_crashes} times in "
                f"{child.policy.window_seconds:.0f} s; giving up (logs: {home / 'logs'})"
            )
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            if stopping():
                raise StackError(f"{child.name} not restarted: the stack is stopping")
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        try:
            restarted, _ = _start(child.name, child.module, child.restart_args, home, env)
        except StackError as err:
            print(f"orchard: restarting {child.name} failed: {err}", file=sys.stderr, flush=True)
            continue
        restarted.policy = child.policy
        print(
            f"orchard: {child.name} restarted (pid {restarted.process.pid}, "
            f"crash {child.policy.recent_crashes} in {child.policy.window_seconds:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
        return restarted


def set_control_plane_priority(nice: int) -> None:
    """Run this process, and so every child it starts, at CPU priority ``nice``.

    With hundreds of busy sandboxes the control plane's calls (a create's runc, an
    exec's relay) otherwise wait behind them and behind a co-located load
    generator. The nice value is per thread and inherited, so this is done before
    any thread or child exists; orchard-init puts each sandbox back to 0. With
    the kernel's autogroups on (each session one scheduling entity), a task's
    nice only counts inside its session: :func:`_session_priority` sets each
    child's session as well.
    """
    if not -20 <= nice <= 19:
        raise StackError(f"--nice {nice}: expected -20..19")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        print(
            f"orchard up: warning: cannot set the control plane's priority to nice {nice} "
            "(needs root or CAP_SYS_NICE); it runs at "
            f"{os.getpriority(os.PRIO_PROCESS, 0)} and busy sandboxes can slow its calls",
            file=sys.stderr,
            flush=True,
        )


def _session_priority(pid: int) -> None:
    """Give the child's session (its own autogroup: it leads a new session) this process's
    nice, which the child inherited as a task; without autogroups the file is absent and
    the task's nice is what counts."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{os.getpriority(os.PRIO_PROCESS, 0)}\n")
    except FileNotFoundError:
        pass  # no autogroups in this kernel (or the child is gone: its start reports that)
    except PermissionError as err:
        print(f"orchard up: warning: session priority of pid {pid}: {err}", file=sys.stderr)


@dataclass(frozen=True)
class _TLSArgs:
    """The children's TLS flags (all empty without ``--tls``)."""

    server: list[str] = field(default_factory=list)
    """``--tls-cert``/``--tls-key``: what every serving child presents."""
    upstream: list[str] = field(default_factory=list)
    """``--tls-upstream-ca``: how the gateway and nginx verify the executor."""
    gateway_ca: list[str] = field(default_factory=list)
    """``--gateway-ca``: how the rewards service verifies the gateway."""

    @property
    def on(self) -> bool:
        return bool(self.server)

    @classmethod
    def make(cls, home: Path, layout: NodeLayout, host: str) -> _TLSArgs:
        # Imported here: `cryptography` is a [server] package and the thin CLI imports this module.
        from orchard.common.local_ca import LocalCA

        ca = LocalCA.of_home(home)
        try:
            ca.ensure([host])
        except (OSError, ValueError) as err:
            raise StackError(f"--tls: cannot make the local CA under {ca.root}: {err}") from None
        public = layout.run / "ca.pem"
        staged = public.with_name(".ca.pem.tmp")
        staged.write_bytes(ca.ca_file.read_bytes())
        staged.replace(public)
        return cls(
            server=["--tls-cert", str(ca.cert_file), "--tls-key", str(ca.key_file)],
            upstream=["--tls-upstream-ca", str(ca.ca_file)],
            gateway_ca=["--gateway-ca", str(ca.ca_file)],
        )


def _issue_internal_certificates(home: Path) -> None:
    """The internal CA and every service's certificate, before any service starts (so two
    children never race to make the CA)."""
    from orchard.common.internal_pki import InternalPKI, InternalPKIError

    pki = InternalPKI.of_home(home)
    try:
        pki.ensure()
    except (OSError, ValueError, InternalPKIError) as err:
        raise StackError(f"cannot issue the internal certificates in {pki.root}: {err}") from None


def writable_layer(run_dir: Path) -> str:
    """What the scheduler's local backend chose for sandboxes' writable layer, in one line
    (``scratch.choose`` decides by kernel and writes it at start)."""
    from orchard.scheduler.backends.local.scratch import WRITABLE_LAYER_FILE

    try:
        return str(json.loads((run_dir / WRITABLE_LAYER_FILE).read_text())["summary"])
    except (OSError, ValueError, KeyError) as err:
        return f"unknown (run/{WRITABLE_LAYER_FILE}: {err})"


def _start_model_proxy(
    args: argparse.Namespace,
    home: Path,
    env: dict[str, str],
    gateway: str,
    tls: _TLSArgs,
    children: list[Child],
) -> str:
    """Start the recording model proxy (``orchard.modelproxy``) after the gateway it asks about
    tenants' keys; its URL (``https://`` under ``--tls``, the node's certificate), or "" with
    ``--model-proxy-port -1``."""
    port = args.model_proxy_port
    port = port if port is not None else (0 if args.port == 0 else 50090)
    if port < 0:
        return ""
    proxy, address = _start(
        "modelproxy", "orchard.modelproxy",
        ["--listen", f"{args.host}:{port}", "--gateway", gateway, "--upstream", args.model_upstream,
         *tls.gateway_ca, *tls.server],
        home, env,
    )  # fmt: skip
    bound = address.removeprefix("https://").removeprefix("http://")
    proxy.restart_args = _pinned(proxy.restart_args, "--listen", bound)
    children.append(proxy)
    return address


def cmd_up(args: argparse.Namespace) -> int:
    _extras.require("orchard up", ("server", "rewards"))
    from orchard.scheduler.backends.local.scratch import WRITABLE_LAYER_FILE

    home: Path = (args.home or orchard_home()).resolve()
    layout = NodeLayout(home)
    layout.run.mkdir(parents=True, exist_ok=True)
    for stale in (
        "gateway.addr",
        "scheduler.addr",
        "executor.addr",
        "gateway-http.addr",
        "rewards.addr",
        "data-plane.addr",
        "modelproxy.addr",
        "ca.pem",
        WRITABLE_LAYER_FILE,
    ):
        (layout.run / stale).unlink(missing_ok=True)
    tls = _TLSArgs.make(home, layout, args.host) if args.tls else _TLSArgs()
    _issue_internal_certificates(home)
    # gRPC core logs every refused TLS handshake at INFO, to the children's logs in the
    # data directory: any local process could fill it by knocking on the scheduler's
    # mTLS port. Errors only, unless the operator asks for more.
    env = {"GRPC_VERBOSITY": "ERROR", **os.environ, "ORCHARD_HOME": str(home)}
    env["PYTHONUNBUFFERED"] = "1"
    # TLS is orchard up's choice (--tls), never half-inherited from this shell's environment.
    for name in (*_TLS_ENV, "ORCHARD_TLS_CA"):
        env.pop(name, None)
    if tls.on:  # the rewards service's SDK dials the grpcs:// gateway with it
        env["ORCHARD_TLS_CA"] = str(layout.run / "ca.pem")

    stopping = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    set_control_plane_priority(args.nice)

    # Every service serves Prometheus /metrics on a free port (run/<service>.metrics.addr).
    metrics = ["--metrics-listen", "127.0.0.1:0"]
    http_port = args.http_port if args.http_port is not None else (0 if args.port == 0 else 50080)
    rest = [] if http_port < 0 else ["--http-listen", f"{args.host}:{http_port}"]
    if args.data_plane_proxy not in DATA_PLANE_PROXIES:  # argparse does not check a default
        raise StackError(
            f"data-plane proxy {args.data_plane_proxy!r} ($ORCHARD_DATA_PLANE_PROXY): "
            f"expected one of {', '.join(DATA_PLANE_PROXIES)}"
        )
    if args.data_plane_proxy == "nginx":
        try:  # fail before starting anything: no silent fallback to the Python proxy
            nginx_binary()
        except NginxMissingError as err:
            raise StackError(str(err)) from None
    no_python_proxy = ["--no-data-plane-proxy"] if args.data_plane_proxy == "off" else []
    children: list[Child] = []
    try:
        executor, executor_addr = _start(
            "executor", "orchard.executor", ["--listen", "127.0.0.1:0", *metrics, *tls.server],
            home, env,
        )  # fmt: skip
        executor.restart_args = _pinned(executor.restart_args, "--listen", executor_addr)
        children.append(executor)
        scheduler, scheduler_addr = _start(
            "scheduler",
            "orchard.scheduler",
            ["--listen", "127.0.0.1:0", "--executor-address", executor_addr, "--backend", "local",
             "--init-binary", str(ensure_init_binary(home)), "--delete-all-on-shutdown", *metrics,
             *(["--executor-tls"] if tls.on else [])],
            home,
            env,
        )  # fmt: skip
        scheduler.restart_args = _pinned(scheduler.restart_args, "--listen", scheduler_addr)
        children.append(scheduler)
        gateway, endpoint = _start(
            "gateway", "orchard.gateway", ["--listen", f"{args.host}:{args.port}", "--scheduler", scheduler_addr,
                                           *metrics, *rest, *no_python_proxy, *tls.server, *tls.upstream],
            home, env,
        )  # fmt: skip
        gateway.restart_args = _pinned(
            gateway.restart_args, "--listen", f"{args.host}:{endpoint.rsplit(':', 1)[1]}"
        )
        if rest:
            gateway.restart_args = _pinned(
                gateway.restart_args,
                "--http-listen",
                (layout.run / "gateway-http.addr").read_text().strip().removeprefix("https://"),
            )
        children.append(gateway)
        data_plane = None
        if args.data_plane_proxy == "nginx":
            dp_port = args.data_plane_port
            dp_port = dp_port if dp_port is not None else (0 if args.port == 0 else 50052)
            nginx, data_plane = _start(
                "data-plane-proxy", "orchard.gateway.proxy_nginx_main",
                ["--listen", f"{args.host}:{dp_port}", "--executor", executor_addr,
                 *tls.server, *tls.upstream],
                home, env,
            )  # fmt: skip
            nginx.restart_args = _pinned(
                nginx.restart_args, "--listen", data_plane.removeprefix("grpcs://")
            )
            children.append(nginx)
        rewards, rewards_addr = _start(
            "rewards",
            "orchard.rewards",
            ["--listen", "127.0.0.1:0", "--gateway", endpoint, *tls.server, *tls.gateway_ca],
            home,
            env,
        )
        rewards.restart_args = _pinned(
            rewards.restart_args, "--listen", rewards_addr.removeprefix("grpcs://")
        )
        children.append(rewards)
        proxy_addr = _start_model_proxy(args, home, env, endpoint, tls, children)
        print(f"Orchard is up. Endpoint: {endpoint}", flush=True)
        print(f"Dev API key: {home / 'dev-api-key'}", flush=True)
        print(f"Rewards: {rewards_addr}", flush=True)
        if proxy_addr:
            print(f"Model proxy: {proxy_addr}  (POST /v1/sessions; docs/modelproxy.md)", flush=True)
        if rest:
            http = (layout.run / "gateway-http.addr").read_text().strip()
            http = http if http.startswith("https://") else f"http://{http}"
            print(f"REST/JSON: {http}/v1/<Service>/<Method>", flush=True)
        if tls.on:
            print(
                f"TLS CA: {layout.run / 'ca.pem'}  (clients trust it; ORCHARD_TLS_CA)", flush=True
            )
        if data_plane:
            print(f"Data-plane proxy (nginx): {data_plane}  (run/data-plane.addr)", flush=True)
        from orchard.common.metrics import metrics_token_file  # the server extra's

        print(
            f"Metrics: {layout.run}/<service>.metrics.addr (Prometheus /metrics; "
            f"Authorization: Bearer of {metrics_token_file(home)})",
            flush=True,
        )
        print(f"Sandbox writable layer: {writable_layer(layout.run)}", flush=True)
        print(
            f"Logs: {home / 'logs'}  (Ctrl-C stops the stack and deletes its sandboxes)", flush=True
        )
        code = 0
        while not stopping and code == 0:
            for i, child in enumerate(children):
                if child.process.poll() is None:
                    continue
                print(
                    f"orchard: {child.name} stopped unexpectedly (exit {child.process.returncode}); "
                    f"restarting it (logs: {home / 'logs'})",
                    file=sys.stderr,
                    flush=True,
                )
                try:
                    children[i] = _restart(child, home, env, lambda: stopping)
                except StackError as err:
                    if not stopping:
                        print(f"orchard: {err}; shutting down", file=sys.stderr, flush=True)
                        code = 1
                    break
            time.sleep(0.2)
        return code
    finally:
        for child in reversed(children):
            _stop(child)
        (layout.run / "gateway.addr").unlink(missing_ok=True)
        print("Orchard stopped.", flush=True)
