"""orchard-init's FLAG_PTY through the real binary, with a raw socket where the client
misbehaves: a terminal request that also asks for stdin pipes, or has no size after its
header, is refused (the connection closes with no answer); a good one answers 'S' with
exactly one fd, the master, whose slave is the command's controlling terminal."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchard.executor.init_protocol import (
    FLAG_PTY,
    FLAG_STDIN,
    MAGIC,
    InitRequest,
    encode_request,
)

from .harness import HostSandbox

ENV = ("PATH=/usr/local/bin:/usr/bin:/bin",)


@pytest.fixture(scope="module")
def box(node_home: Path, init_binary: Path) -> Iterator[HostSandbox]:
    sandbox = HostSandbox("sb-init-pty", node_home, init_binary).create()
    try:
        yield sandbox
    finally:
        sandbox.stop()


def _send(box: HostSandbox, payload: bytes) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(10)
    conn.connect(str(box.dir / "init.sock"))
    conn.sendall(payload)
    return conn


def _raw(flags: int, with_size: bool) -> bytes:
    strings = b"/\0sh\0" + b"\0".join(e.encode() for e in ENV) + b"\0"
    body = struct.pack("<I6I", MAGIC, flags, 0, 0, 0, 1, len(ENV))
    if with_size:
        body += struct.pack("<HH", 24, 80)
    body += strings
    return struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(
    "flags, with_size", [(FLAG_PTY | FLAG_STDIN, True), (FLAG_PTY, False)], ids=["stdin", "no-size"]
)
def test_a_malformed_terminal_request_is_refused(
    box: HostSandbox, flags: int, with_size: bool
) -> None:
    conn = _send(box, _raw(flags, with_size))
    try:
        assert conn.recv(64) == b""  # closed, nothing started
    finally:
        conn.close()


def test_a_terminal_answers_one_fd_the_master(box: HostSandbox) -> None:
    request = InitRequest(argv=("sh", "-c", "tty; stty size"), env=ENV, cwd="/", pty=(5, 77))
    conn = _send(box, encode_request(request))
    try:
        data, fds, _flags, _addr = socket.recv_fds(conn, 5, 4)
        assert data[:1] == b"S" and len(fds) == 1
        master = fds[0]
        out = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every slave fd is closed
                break
            if not chunk:
                break
            out += chunk
        os.close(master)
        assert b"/dev/pts/" in out and b"5 77" in out
        exit_report = conn.recv(18, socket.MSG_WAITALL)
        assert exit_report[:1] == b"X" and struct.unpack("<i", exit_report[1:5])[0] == 0
    finally:
        conn.close()


def test_the_python_side_refuses_what_init_would() -> None:
    with pytest.raises(ValueError):
        encode_request(InitRequest(argv=("sh",), env=(), cwd="/", pty=(0, 80)))
    with pytest.raises(ValueError):
        encode_request(InitRequest(argv=("sh",), env=(), cwd="/", pty=(24, 80), stdin=True))
