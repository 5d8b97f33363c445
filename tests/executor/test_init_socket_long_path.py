"""The executor reaches orchard-init's socket however deep the node's home is.

A Unix socket path is at most 107 bytes for ``connect``; a home under a long
ORCHARD_HOME (or a test worker's tmp folder) made every exec fail with "AF_UNIX
path too long". The client now connects through an fd of the socket's folder.
A real listening socket stands in for init (it only has to receive the request).
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from orchard.executor import init_client
from orchard.executor.init_protocol import InitRequest, encode_request


def _listen_deep(folder: Path) -> socket.socket:
    """A listener at ``folder/init.sock`` (bound through the folder's fd, as the path is too long)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY)
    try:
        server.bind(f"/proc/self/fd/{fd}/init.sock")
    finally:
        os.close(fd)
    server.listen(1)
    return server


def test_a_socket_deeper_than_the_kernel_limit_is_reached(tmp_path: Path) -> None:
    folder = tmp_path / ("d" * 60) / ("e" * 60)
    folder.mkdir(parents=True)
    path = str(folder / "init.sock")
    assert len(os.fsencode(path)) > init_client.MAX_UNIX_PATH
    server = _listen_deep(folder)
    request = InitRequest(argv=("true",), env=(), cwd="/")

    async def send() -> socket.socket:
        return await init_client._send_request(asyncio.get_running_loop(), path, request)

    conn = asyncio.run(send())
    peer, _ = server.accept()
    expected = encode_request(request)
    got = b""
    while len(got) < len(expected):
        got += peer.recv(65536)
    assert got == expected
    for s in (conn, peer, server):
        s.close()
    # No fd of the folder is left open behind the call.
    fds = os.listdir("/proc/self/fd")
    assert not any(
        os.readlink(f"/proc/self/fd/{fd}") == str(folder)
        for fd in fds
        if fd.isdigit() and os.path.exists(f"/proc/self/fd/{fd}")
    )


def test_a_missing_deep_socket_is_init_unavailable(tmp_path: Path) -> None:
    folder = tmp_path / ("f" * 70) / ("g" * 50)
    folder.mkdir(parents=True)
    request = InitRequest(argv=("true",), env=(), cwd="/")

    async def send() -> None:
        await init_client._send_request(
            asyncio.get_running_loop(), str(folder / "init.sock"), request
        )

    try:
        asyncio.run(send())
    except init_client.InitUnavailable as exc:
        assert "not listening" in str(exc)
    else:
        raise AssertionError("connected to a socket that does not exist")
