"""The port dialer's own refusals (port_dial.py), without a stack.

What a hostile caller could aim at: an address outside the sandbox's loopback,
and, through a stale or reused init pid, a namespace that is not the
sandbox's (the node's own above all). Each is refused before any socket
exists. A namespace the test creates (``unshare --net``) checks the dial
itself: a server there is reached, and the same port on the host is not.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from orchard.executor.port_dial import NamespaceDialer, check_target
from orchard.executor.sandboxes import Sandbox

from orchard.common.errors import ServiceError
from orchard.common.layout import SandboxMeta


def _sandbox(pid: int, rootfs: Path) -> Sandbox:
    return Sandbox("sb-test", rootfs, SandboxMeta("sb-test", init_pid=pid), "")


@pytest.mark.parametrize(
    "host", ["10.0.0.1", "0.0.0.0", "localhost", "::ffff:127.0.0.1", "127.0.0.2", "::", "a" * 300]
)
def test_only_the_loopback_addresses(host: str) -> None:
    with pytest.raises(ServiceError) as refused:
        check_target(host, 80)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("port", [0, -1, 65536, 2**32])
def test_only_real_ports(port: int) -> None:
    with pytest.raises(ServiceError):
        check_target("", port)


def test_loopback_targets() -> None:
    assert check_target("", 8000) == (socket.AF_INET, ("127.0.0.1", 8000))
    assert check_target("::1", 1) == (socket.AF_INET6, ("::1", 1))


@pytest.fixture
def dialer() -> Iterator[NamespaceDialer]:
    if os.geteuid() != 0:
        pytest.skip("needs root (setns)")
    d = NamespaceDialer()
    yield d
    d.close()


def test_the_nodes_own_namespace_is_refused(dialer: NamespaceDialer) -> None:
    # This process is "the sandbox's init" and its root is "/": the identity holds, so
    # only the namespace check stands between the caller and the node's loopback.
    with pytest.raises(ServiceError) as refused:
        dialer.sandbox_netns(_sandbox(os.getpid(), Path("/")))
    assert "node's network namespace" in refused.value.message


def test_a_reused_pid_is_refused(dialer: NamespaceDialer, tmp_path: Path) -> None:
    # The pid is alive but its root is not the sandbox's rootfs: another process.
    with pytest.raises(ServiceError) as refused:
        dialer.sandbox_netns(_sandbox(os.getpid(), tmp_path))
    assert "not running" in refused.value.message


def test_no_or_gone_init(dialer: NamespaceDialer, tmp_path: Path) -> None:
    for pid in (0, 1, 2**22 + 12345):
        with pytest.raises(ServiceError):
            dialer.sandbox_netns(_sandbox(pid, tmp_path))


SERVER = """
import socket, sys
s = socket.create_server(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
c, _ = s.accept()
c.sendall(b"from the namespace")
c.close()
"""


@pytest.mark.skipif(
    shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="needs util-linux and iproute2",
)
def test_the_dial_lands_in_the_sandboxs_namespace(dialer: NamespaceDialer) -> None:
    host = socket.create_server(("127.0.0.1", 0))  # the same port on the node's loopback
    port = host.getsockname()[1]
    host.settimeout(0.3)
    inside = subprocess.Popen(
        [
            "unshare",
            "--net",
            "sh",
            "-c",
            f"ip link set lo up && exec {sys.executable} -c '{SERVER}' {port}",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert inside.stdout is not None and inside.stdout.readline() == b"ready\n"

        async def dial() -> bytes:
            sock = await dialer.dial(
                _sandbox(inside.pid, Path("/")), socket.AF_INET, ("127.0.0.1", port), 5
            )
            with sock:
                loop = asyncio.get_running_loop()
                return await loop.sock_recv(sock, 100)

        # unshare and sh exec: the pid is the server's, in the new namespace, root "/".
        assert asyncio.run(dial()) == b"from the namespace"
        with pytest.raises(TimeoutError):
            host.accept()  # the node's listener on that port saw nothing
        # The dialer's thread came back home: a socket made there is on the node.
        home = dialer._thread.submit(lambda: os.stat("/proc/thread-self/ns/net").st_ino)
        assert home.result() == os.stat("/proc/self/ns/net").st_ino
    finally:
        inside.kill()
        inside.wait()
        if inside.stdout is not None:
            inside.stdout.close()
        host.close()
