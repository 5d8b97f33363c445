"""Data-plane checks both proxies (the gateway's Python one and nginx) must pass."""

from __future__ import annotations

from orchard import ExecStatus, OutputChunk, Sandbox


def check_exec_and_streaming_exec(sb: Sandbox) -> None:
    result = sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    # Exec (bidi): stdin fed as the command reads, output streamed back.
    events = list(sb.exec_stream(["cat"], stdin=[b"a" * 70_000, b"b" * 70_000]))
    out = b"".join(e.data for e in events if isinstance(e, OutputChunk))
    assert out == b"a" * 70_000 + b"b" * 70_000
    assert isinstance(events[-1], ExecStatus) and events[-1].exit_code == 0


def check_session(sb: Sandbox) -> None:
    with sb.session() as sh:
        assert sh.run("X=41; cd /tmp").exit_code == 0
        got = sh.run("echo $((X+1)) $(pwd)")
    assert got.stdout == b"42 /tmp\n"
