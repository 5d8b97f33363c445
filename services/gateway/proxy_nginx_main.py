"""``python -m orchard.gateway.proxy_nginx_main``: run nginx as the data-plane proxy.

``orchard up --data-plane-proxy nginx`` starts this like its other children:
it writes ``<home>/run/nginx/nginx.conf`` (``proxy_nginx.render_conf``), starts
nginx in the foreground, waits until its port accepts connections, then
prints the address on stdout (the readiness line ``orchard up`` waits for) and
writes it to ``<home>/run/data-plane.addr``, where the SDK's proxy mode finds
it (``grpcs://host:port`` when nginx serves TLS: ``--tls-cert``/``--tls-key``;
``--tls-upstream-ca`` makes it dial TLS executors). It stays nginx's parent: SIGTERM/SIGINT are passed on to nginx (fast
shutdown; the stack is stopping), and when nginx exits so does this, with
nginx's code, so ``orchard up`` restarts both on the same address.
"""

from __future__ import annotations

import argparse
import ctypes
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from orchard.common.address_file import remove_address_file, write_address_file
from orchard.common.layout import NodeLayout
from orchard.common.tls_args import add_tls_arguments, tls_paths, upstream_ca

from .proxy_nginx import NginxMissingError, NginxPaths, NginxTLS, nginx_binary, write_conf

READY_TIMEOUT_SECONDS = 20.0
DATA_PLANE_ADDR_FILE = "data-plane.addr"
PR_SET_PDEATHSIG = 1


def _free_address(listen: str) -> str:
    """``listen`` with port 0 replaced by a port free now (nginx cannot report one it picked)."""
    host, _, port = listen.rpartition(":")
    if port != "0":
        return listen
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host.strip("[]"), 0))
        return f"{host}:{probe.getsockname()[1]}"


def _die_with_parent() -> None:
    """In nginx before exec: SIGKILL it when this process dies (even by SIGKILL), so a
    restarted wrapper never finds its port held by a left-over nginx."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _connectable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    try:
        with socket.create_connection((host, int(port)), timeout=0.2):
            return True
    except OSError:
        return False


def _wait_listening(process: subprocess.Popen[bytes], address: str, paths: NginxPaths) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while not _connectable(address):
        if process.poll() is not None:
            raise SystemExit(
                f"nginx exited with code {process.returncode} while starting (log: {paths.error_log})"
            )
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise SystemExit(f"nginx did not listen on {address} in {READY_TIMEOUT_SECONDS:.0f} s")
        time.sleep(0.02)


def _absolute(path: Path | None) -> Path | None:
    return None if path is None else path.resolve()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port (port 0: a free one)")
    parser.add_argument(
        "--executor", action="append", required=True, help="a node executor's host:port"
    )
    parser.add_argument("--nginx", default=None, help="the nginx binary (default: on PATH)")
    add_tls_arguments(
        parser, upstream="dial the executors with TLS, trusting this CA (none: plaintext executors)"
    )
    parser.add_argument(
        "--tls-upstream-name",
        default="localhost",
        help="the DNS name the executors' certificate must carry (default localhost)",
    )
    args = parser.parse_args(argv)
    try:
        cert, key, client_ca = (_absolute(p) for p in tls_paths(args))
        tls = NginxTLS(
            cert_file=cert,
            key_file=key,
            client_ca_file=client_ca,
            upstream_ca_file=_absolute(upstream_ca(args)),
            upstream_name=args.tls_upstream_name,
        )
    except ValueError as err:
        parser.error(str(err))
    try:
        binary = nginx_binary(args.nginx)
    except NginxMissingError as err:
        print(f"orchard: {err}", file=sys.stderr)
        return 2
    layout = NodeLayout(args.home)
    paths = NginxPaths(layout.run / "nginx", args.home / "logs")
    address = _free_address(args.listen)
    conf = write_conf(address, args.executor, paths, tls)
    process = subprocess.Popen(
        [binary, "-c", str(conf), "-p", str(paths.root), "-e", str(paths.error_log)],
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,  # only prctl: safe without threads
    )

    stopping = False

    def forward(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    _wait_listening(process, address, paths)
    addr_file = layout.run / DATA_PLANE_ADDR_FILE
    # The SDK reads the scheme: grpcs:// when clients must speak TLS to nginx.
    announced = ("grpcs://" if tls.serves_tls else "") + address
    write_address_file(addr_file, announced)
    print(announced, flush=True)
    code = process.wait()
    # Only an orderly stop takes the address away: when nginx dies, orchard up
    # restarts us on the same address, and clients reading the file meanwhile
    # must keep finding it (they see UNAVAILABLE for a moment, not the gateway).
    if stopping:
        remove_address_file(addr_file, announced)
    return code


if __name__ == "__main__":
    sys.exit(main())
