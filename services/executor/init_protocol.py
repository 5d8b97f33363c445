"""The orchard-init wire format (v1), without any I/O.

Kept apart from the asyncio client so the byte layout is in one small place
that tests can check against the C side (docs/architecture.md, "The
orchard-init protocol"). All integers are little-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0x4F524331  # "ORC1"

FLAG_STDIN = 1
FLAG_SESSION_FDS = 2
FLAG_NEW_SESSION = 4
FLAG_INLINE_OUTPUT = 8
FLAG_KILL_ALL = 16
FLAG_PTY = 32

STAGE_CHDIR = 1
STAGE_CREDENTIALS = 2
STAGE_EXEC = 3
STAGE_OTHER = 4
STAGE_PTY = 5

# Must match MAX_REQUEST_BYTES / MAX_STRINGS in orchard_init.c. Above what execve can
# take (orchard.common.exec_limits: at most 6 MiB of strings and pointers, so fewer than
# 6 MiB / 9 strings), so the kernel's limit, checked by the executor, is the one that binds.
MAX_REQUEST_BYTES = 8 << 20
MAX_STRINGS = 1 << 20

STARTED_SIZE = 5  # 'S' + u32 pid
ERROR_SIZE = 9  # 'E' + u32 errno + u32 stage
EXIT_SIZE = 18  # 'X' + i32 code + i32 signal + u8 timed_out + u64 duration_ns
DATA_HEADER_SIZE = 6  # 'D' + u8 stream (1 stdout, 2 stderr) + u32 length, then the bytes
STDOUT = 1
STDERR = 2

_HEADER = struct.Struct("<I7I")
_ERROR = struct.Struct("<II")
_EXIT = struct.Struct("<iiBQ")
_SIGNAL = struct.Struct("<cI")
_PTY_SIZE = struct.Struct("<HH")


class ProtocolError(Exception):
    """orchard-init answered something that is not protocol v1."""


@dataclass(frozen=True, slots=True)
class InitRequest:
    """One command for orchard-init to start."""

    argv: tuple[str, ...]
    env: tuple[str, ...]  # "NAME=value" entries
    cwd: str
    uid: int = 0
    gid: int = 0
    timeout_ms: int = 0
    stdin: bool = False
    session_fds: bool = False
    new_session: bool = False
    inline_output: bool = False
    """The shim forwards stdout/stderr as 'D' frames on the connection (no 'S',
    no fds); only without ``stdin`` and ``session_fds``."""
    pty: tuple[int, int] | None = None
    """A terminal of (rows, cols): the command's fds 0..2 are the slave of a
    pseudo-terminal the shim allocates in the sandbox, and the 'S' answer carries
    one fd, the master (excludes ``stdin``, ``session_fds`` and inline output)."""
    kill_all: bool = False
    """Not a command: the shim signals every process of the sandbox but pid 1
    (see :func:`kill_all_request`) and answers 'A' + u32 count."""

    @property
    def flags(self) -> int:
        return (
            (FLAG_STDIN if self.stdin else 0)
            | (FLAG_SESSION_FDS if self.session_fds else 0)
            | (FLAG_NEW_SESSION if self.new_session else 0)
            | (FLAG_INLINE_OUTPUT if self.inline_output else 0)
            | (FLAG_KILL_ALL if self.kill_all else 0)
            | (FLAG_PTY if self.pty is not None else 0)
        )

    @property
    def fd_count(self) -> int:
        """How many fds the 'S' answer carries for this request."""
        if self.pty is not None:
            return 1
        return 2 + (1 if self.stdin else 0) + (2 if self.session_fds else 0)


def encode_request(request: InitRequest) -> bytes:
    """The length-prefixed request; raises ValueError if init would refuse it."""
    if not request.argv or not request.argv[0]:
        raise ValueError("argv must have a non-empty first element")
    if not request.cwd:
        raise ValueError("cwd must not be empty")
    strings = (request.cwd, *request.argv, *request.env)
    if len(request.argv) + len(request.env) > 2 * MAX_STRINGS:
        raise ValueError("too many argv/env entries")
    encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
    if any(b"\0" in s for s in encoded):
        raise ValueError("argv, env and cwd must not contain NUL bytes")
    body_strings = b"\0".join(encoded) + b"\0"
    pty_size = _pty_size(request)
    body_len = _HEADER.size - 4 + len(pty_size) + len(body_strings)
    if body_len > MAX_REQUEST_BYTES:
        raise ValueError(f"request is {body_len} bytes; the limit is {MAX_REQUEST_BYTES}")
    if request.inline_output and (request.stdin or request.session_fds):
        raise ValueError("inline output excludes stdin and session fds")
    for value in (request.uid, request.gid):
        if not 0 <= value < 0xFFFFFFFF:
            raise ValueError(f"uid/gid {value} out of range")
    header = _HEADER.pack(
        body_len,
        MAGIC,
        request.flags,
        request.uid,
        request.gid,
        min(max(request.timeout_ms, 0), 0xFFFFFFFF),
        len(request.argv),
        len(request.env),
    )
    return header + pty_size + body_strings


def _pty_size(request: InitRequest) -> bytes:
    """FLAG_PTY's two u16 after the header: the terminal's rows and columns."""
    if request.pty is None:
        return b""
    if request.stdin or request.session_fds or request.inline_output:
        raise ValueError("a terminal excludes stdin pipes, session fds and inline output")
    rows, cols = request.pty
    if not (1 <= rows <= 0xFFFF and 1 <= cols <= 0xFFFF):
        raise ValueError(f"terminal size {rows}x{cols} is out of range (1..65535)")
    return _PTY_SIZE.pack(rows, cols)


@dataclass(frozen=True, slots=True)
class StartFailure:
    """The 'E' answer: the command never ran."""

    errno: int
    stage: int


@dataclass(frozen=True, slots=True)
class ExitReport:
    """The 'X' answer: how the command ended."""

    exit_code: int
    signal: int
    timed_out: bool
    duration_ns: int


def decode_error(message: bytes) -> StartFailure:
    if len(message) != ERROR_SIZE or message[:1] != b"E":
        raise ProtocolError(f"bad error message {message!r}")
    errno, stage = _ERROR.unpack(message[1:])
    return StartFailure(errno, stage)


def decode_pid(message: bytes) -> int:
    if len(message) != STARTED_SIZE or message[:1] != b"S":
        raise ProtocolError(f"bad started message {message!r}")
    return int.from_bytes(message[1:], "little")


def decode_exit(message: bytes) -> ExitReport:
    if len(message) != EXIT_SIZE or message[:1] != b"X":
        raise ProtocolError(f"bad exit message {message!r}")
    code, sig, timed_out, duration = _EXIT.unpack(message[1:])
    return ExitReport(code, sig, bool(timed_out), duration)


KILL_ALL_SIZE = 5  # 'A' + u32 how many processes were signalled


def kill_all_request(signal: int, keep_pid: int = 0) -> InitRequest:
    """Signal every process of the sandbox but pid 1 (and ``keep_pid`` with its
    descendants: the injected executor, which lives in the sandbox)."""
    if not 1 <= signal <= 64:
        raise ValueError(f"signal {signal} is not 1..64")
    if keep_pid < 0:
        raise ValueError("keep_pid must be >= 0")
    return InitRequest(
        argv=("kill-all", str(signal), str(keep_pid)), env=(), cwd="/", kill_all=True
    )


def decode_kill_all(message: bytes) -> int:
    if len(message) != KILL_ALL_SIZE or message[:1] != b"A":
        raise ProtocolError(f"bad kill-all answer {message!r}")
    return int.from_bytes(message[1:], "little")


def encode_signal(signal: int) -> bytes:
    return _SIGNAL.pack(b"K", signal)


KILL_TREE = b"T"
