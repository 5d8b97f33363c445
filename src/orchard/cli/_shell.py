"""``orchard shell ID``: an interactive shell in a sandbox, on a real terminal.

The remote side is a terminal process (``Sandbox.terminal``: a pseudo-terminal
allocated inside the sandbox); this side puts the local terminal in raw mode,
so every key (Ctrl-C, Ctrl-Z, arrows) goes to the remote line discipline as
bytes, and the remote screen's bytes come back unchanged. SIGWINCH resizes
the remote terminal. The CLI's exit code is the remote shell's (the shell
convention of ``orchard exec`` for signals and timeouts).

Threads: the main thread reads the process's output; one input thread waits
on stdin and on a wake-up pipe that ``signal.set_wakeup_fd`` writes when a
SIGWINCH arrives (written by the C handler at once, whatever the main thread
is blocked in). A lost output stream is re-attached from the last offset
read, so a network blip shows nothing twice and loses nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import termios
import threading
import tty
from typing import Any

from orchard.client import (
    ExecStatus,
    InfrastructureError,
    InvalidRequestError,
    OrchardError,
    OutputChunk,
    Process,
)

from ._connect import client
from ._sandboxes import exit_code_of, pairs

REATTACH_TRIES = 3


def register(commands: Any) -> None:
    p = commands.add_parser("shell", help="an interactive shell (a terminal) in a sandbox")
    p.add_argument("id", metavar="ID")
    p.add_argument("--cwd", help="working directory in the sandbox")
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("--user", help="user name or uid[:gid] in the sandbox")
    p.add_argument(
        "--attach",
        metavar="PROCESS",
        help="re-attach to a terminal process started before (its screen is replayed)",
    )
    p.add_argument(
        "cmd", nargs="*", metavar="-- CMD ARGS", help="what to run (default: a login shell)"
    )
    p.set_defaults(run=cmd_shell)


def cmd_shell(args: argparse.Namespace) -> int:
    stdin_fd = sys.stdin.fileno()
    if not os.isatty(stdin_fd):
        raise InvalidRequestError(
            "orchard shell needs a terminal on stdin (for pipes use `orchard exec -i`)"
        )
    sb = client(args).sandboxes.connect(args.id)
    size = os.get_terminal_size(stdin_fd)
    if args.attach:
        proc = sb.process(args.attach)
        proc.resize(size.lines, size.columns)
    else:
        env = {"TERM": os.environ.get("TERM") or "xterm-256color", **pairs(args.env, "--env")}
        proc = sb.terminal(
            list(args.cmd) or None, size.lines, size.columns, args.cwd, env, args.user
        )
    saved = termios.tcgetattr(stdin_fd)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous = {sig: signal.signal(sig, _raise_exit) for sig in (signal.SIGHUP, signal.SIGTERM)}
    previous[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, lambda *_: None)
    old_wakeup = signal.set_wakeup_fd(wake_w)
    status: ExecStatus | None = None
    try:
        tty.setraw(stdin_fd)
        threading.Thread(target=_forward_input, args=(proc, stdin_fd, wake_r), daemon=True).start()
        status = _show_output(proc)
    finally:
        termios.tcsetattr(stdin_fd, termios.TCSADRAIN, saved)
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if status is None:
            with contextlib.suppress(OrchardError):
                proc.kill()  # this side is going away: leave no shell behind
    return exit_code_of(status)


def _raise_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _show_output(proc: Process) -> ExecStatus:
    out = sys.stdout.buffer
    tries = 0
    while True:
        try:
            for event in proc.output(offset=proc.offset):
                tries = 0
                if isinstance(event, OutputChunk):
                    out.write(event.data)
                    out.flush()
                elif isinstance(event, ExecStatus):
                    return event
        except InfrastructureError:
            tries += 1
            if tries > REATTACH_TRIES:
                raise
            continue
        raise OrchardError(
            "the terminal's stream ended without an exit status", fault="infrastructure"
        )


def _forward_input(proc: Process, stdin_fd: int, wake_fd: int) -> None:
    """Keys to the remote terminal; a SIGWINCH (a byte on ``wake_fd``) resizes it."""
    try:
        while True:
            ready, _, _ = select.select([stdin_fd, wake_fd], [], [])
            if wake_fd in ready:
                with contextlib.suppress(BlockingIOError):
                    signals = os.read(wake_fd, 64)
                    if signal.SIGWINCH in signals:
                        size = os.get_terminal_size(stdin_fd)
                        proc.resize(size.lines, size.columns)
            if stdin_fd in ready:
                data = os.read(stdin_fd, 4096)
                if not data:
                    return
                proc.write(data)
    except OrchardError:
        return  # the process has ended; the output side reports how
