"""The bash loop a persistent session runs, and how its output is cut.

The session's shell reads NUL-terminated commands on fd 4 and ``eval``s each
one at top level, so ``cd``, variables (even ``declare``), functions and
``export`` persist. After each command it writes the exit code, as
``<decimal>\\0``, to fd 3, then reads an end marker on fd 4 and writes it
to stdout and to stderr, where the executor cuts the command's output. The
eval'd command sees neither fd 3 nor fd 4 (bash saves them close-on-exec
while the redirection lasts) and has /dev/null as stdin.

Why results cannot be forged by a process the command starts (a candidate's
test, say), which runs as the same uid beside the shell:

- the marker is never in bash's argv or environ (``/proc/<pid>/cmdline`` is
  world-readable; it used to carry one marker for the whole session);
- the marker is a fresh secret per command, and it is sent only after the
  command's exit status arrived: while the command runs, no marker exists
  for it to print, so the output cannot be cut early;
- fds 3 and 4 are socket pairs (orchard-init ``make_channel``), which
  ``/proc/<pid>/fd/N`` cannot open again (ENXIO), so no process can write a
  status into the shell's status channel or read its control channel.

What is left: the command's own text runs inside the shell (it is the
caller's, not the sandbox's), and a process with ptrace-level access to the
shell (``ptrace``, ``pidfd_getfd``, ``/proc/<pid>/mem``: same uid and no
Yama here) could still act as the shell; refusing those calls to sandbox
code is the seccomp profile's part (issue 12, class 5).

SIGINT (sent to the shell's process group by an interrupt) kills the
foreground process; the shell's trap then abandons the rest of the command
with ``continue 1000`` (back to the outer loop, out of any loops the command
itself runs) and reports 130. A builtin loop inside a shell *function* is
not abandoned; the per-command timeout then kills the session.
"""

from __future__ import annotations

import secrets

from .output_budget import OutputCharge

# `continue 1000` resumes the outermost loop: ours. A read interrupted by a
# signal returns > 128 and is retried; EOF on fd 4 (the executor went away) ends the shell.
LOOP_SCRIPT = r"""
__orchard_pending=0
trap 'if [ "$__orchard_pending" = 1 ]; then __orchard_rc=130; continue 1000; fi' INT
while :; do
  if [ "$__orchard_pending" = 1 ]; then
    __orchard_pending=0
    printf '%d\0' "$__orchard_rc" >&3
    while :; do
      IFS= read -r -d '' __orchard_marker <&4
      __orchard_read=$?
      [ "$__orchard_read" -gt 128 ] && continue
      break
    done
    [ "$__orchard_read" -ne 0 ] && break
    printf '%s' "$__orchard_marker"
    printf '%s' "$__orchard_marker" >&2
    __orchard_marker=
  fi
  IFS= read -r -d '' __orchard_cmd <&4
  __orchard_read=$?
  if [ "$__orchard_read" -ne 0 ]; then
    [ "$__orchard_read" -gt 128 ] && continue
    break
  fi
  __orchard_rc=130
  __orchard_pending=1
  eval "$__orchard_cmd" 3>&- 4>&- </dev/null
  __orchard_rc=$?
done
"""


def session_argv() -> tuple[str, ...]:
    return ("bash", "--noprofile", "--norc", "-c", LOOP_SCRIPT, "orchard-session")


def new_marker() -> bytes:
    """A fresh end-of-output marker: no command prints it by accident or on purpose."""
    return f"\x1eorchard-end-{secrets.token_hex(16)}\x1e".encode()


class MarkedStream:
    """One of the session's output streams, cut into commands at the marker.

    Output of the running command is kept up to its cap (the rest is counted
    as truncated but still scanned for the marker). The marker is set by
    :meth:`expect` once the command's status is in; until then every byte
    is the command's. Output arriving between
    commands (a background job) is kept, bounded, for the next command: 64
    KiB per stream, uncharged, so a node full of idle sessions (4096) holds
    at most 512 MiB of it.
    """

    BACKLOG_BYTES = 64 << 10

    def __init__(self) -> None:
        self._marker: bytes | None = None
        self._window = bytearray()
        self._active = False
        self._kept = bytearray()
        self._limit = 0
        self._charge: OutputCharge | None = None
        self.truncated = False
        self.found = False

    def begin(self, limit: int, charge: OutputCharge | None = None) -> None:
        self._active = True
        self._kept = bytearray()
        self._limit = limit
        self._charge = charge
        self._marker = None
        self.truncated = False
        self.found = False
        self._scan()

    def expect(self, marker: bytes) -> None:
        """The marker that ends the running command's output (sent to the shell next)."""
        self._marker = marker
        self._scan()

    def feed(self, data: bytes) -> None:
        self._window += data
        self._scan()

    def _scan(self) -> None:
        if not self._active:
            if len(self._window) > self.BACKLOG_BYTES:
                del self._window[: len(self._window) - self.BACKLOG_BYTES]
            return
        if self._marker is None:
            # No marker exists yet: everything so far is the command's output.
            self._keep(self._window)
            self._window.clear()
            return
        index = self._window.find(self._marker)
        if index < 0:
            # Keep back what could be the start of a marker split across reads.
            cut = len(self._window) - (len(self._marker) - 1)
            if cut > 0:
                self._keep(self._window[:cut])
                del self._window[:cut]
            return
        self._keep(self._window[:index])
        del self._window[: index + len(self._marker)]
        self._active = False
        self.found = True

    def _keep(self, data: bytearray) -> None:
        room = self._limit - len(self._kept)
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        if data and self._charge is not None and not self._charge.take(len(data)):
            self._kept = bytearray()  # the call is refused: free what was kept now
            self.truncated = True
            return
        self._kept += data

    def take(self) -> bytes:
        """The command's output so far (all of it once ``found``)."""
        if self._active:
            # The command ended without a marker (the shell died): flush.
            self._keep(self._window)
            self._window.clear()
            self._active = False
        return bytes(self._kept)
