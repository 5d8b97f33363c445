"""``orchard create | exec | cp | ls | kill-all``: sandboxes through the SDK (``rm`` and
``info`` are in their own modules)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import posixpath
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchard.client import (
    ExecStatus,
    InvalidRequestError,
    OrchardError,
    PathError,
    Sandbox,
    SandboxInfo,
)
from orchard.common.exit_codes import shell_status

from ._connect import client
from ._json import add_flag, print_lines

# ``ID:/path`` names a path in a sandbox; anything else is local.
REMOTE_RE = re.compile(r"^([a-z0-9][a-z0-9-]{2,62}):(.*)$")


def register(commands: Any) -> None:
    p = commands.add_parser("create", help="create a sandbox and print its id")
    p.add_argument("--image", help="image name (default: the server's default image)")
    p.add_argument("--cpu", help="cores, e.g. 0.5 or 2 (or '500m')")
    p.add_argument("--memory", help="bytes or a size like 512Mi, 1Gi")
    p.add_argument(
        "--network", choices=["none", "allowlist", "internet"], help="network policy (default none)"
    )
    p.add_argument("--ttl", type=float, help="seconds until the server deletes it")
    p.add_argument("--label", action="append", default=[], metavar="K=V", help="label (repeatable)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="environment variable (repeatable)",
    )
    p.add_argument(
        "--template",
        metavar="NAME",
        help="claim a warm sandbox of this template (image, cpu, memory and network come "
        "from it: leave those unset); see orchard pool ls",
    )
    p.set_defaults(run=cmd_create)

    p = commands.add_parser("exec", help="run a command in a sandbox, streaming its output")
    p.add_argument("id", metavar="ID", help="the sandbox")
    p.add_argument(
        "--timeout", type=float, help="seconds; the command's process tree is killed after"
    )
    p.add_argument("--cwd", help="working directory in the sandbox")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="environment variable (repeatable)",
    )
    p.add_argument("--user", help="user name or uid[:gid] in the sandbox")
    p.add_argument("-i", "--interactive", action="store_true", help="forward this process's stdin")
    p.add_argument("cmd", nargs="*", metavar="-- CMD ARGS", help="the command, after '--'")
    p.set_defaults(run=cmd_exec)

    p = commands.add_parser("cp", help="copy files or directories; ID:/path names a sandbox path")
    p.add_argument("src", metavar="SRC", help="a local path, or ID:/path in a sandbox")
    p.add_argument("dst", metavar="DST", help="a local path, or ID:/path in a sandbox")
    p.set_defaults(run=cmd_cp)

    p = commands.add_parser("ls", help="list your sandboxes")
    p.add_argument(
        "--label", action="append", default=[], metavar="K=V", help="only with this label"
    )
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("-q", "--quiet", action="store_true", help="ids only")
    add_flag(shape)
    p.set_defaults(run=cmd_ls)

    p = commands.add_parser(
        "kill-all", help="kill every process in a sandbox but its init (the sandbox stays)"
    )
    p.add_argument("id", metavar="ID", help="the sandbox")
    p.add_argument("--signal", type=int, default=9, help="signal number (default 9, SIGKILL)")
    p.set_defaults(run=cmd_kill_all)


def pairs(items: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidRequestError(f"{what}: expected K=V, got {item!r}")
        out[key] = value
    return out


def cmd_create(args: argparse.Namespace) -> int:
    sb = client(args).sandboxes.create(
        image=args.image,
        cpu=args.cpu,
        memory=args.memory,
        network=args.network,
        ttl=args.ttl,
        labels=pairs(args.label, "--label"),
        env=pairs(args.env, "--env"),
        template=args.template,
    )
    print(sb.id)
    return 0


def exit_code_of(status: ExecStatus) -> int:
    """The shell-style exit code for how a command ended (124 timeout, 128+N signal N)."""
    return shell_status(status.exit_code, status.signal, status.timed_out)


def _stdin_chunks() -> Iterator[bytes]:
    while chunk := os.read(sys.stdin.fileno(), 64 * 1024):
        yield chunk


def cmd_exec(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if not cmd:
        raise InvalidRequestError("exec: no command given (orchard exec ID -- CMD ARGS...)")
    sb = client(args).sandboxes.connect(args.id)
    status: ExecStatus | None = None
    out, err = sys.stdout.buffer, sys.stderr.buffer
    events = sb.exec_stream(
        cmd,
        timeout=args.timeout,
        cwd=args.cwd,
        env=pairs(args.env, "--env"),
        user=args.user,
        stdin=_stdin_chunks() if args.interactive else None,
    )
    for event in events:
        if isinstance(event, ExecStatus):
            status = event
        elif event.stream == "stdout":
            out.write(event.data)
            out.flush()
        else:
            err.write(event.data)
            err.flush()
    if status is None:
        raise OrchardError(
            "the command's stream ended without an exit status", fault="infrastructure"
        )
    if status.timed_out:
        print(f"orchard: command timed out after {args.timeout} s", file=sys.stderr)
    return exit_code_of(status)


def _split(spec: str) -> tuple[str | None, str]:
    m = REMOTE_RE.match(spec)
    if m and not spec.startswith(("/", ".")):
        return m.group(1), m.group(2) or "/"
    return None, spec


def cmd_cp(args: argparse.Namespace) -> int:
    src_id, src = _split(args.src)
    dst_id, dst = _split(args.dst)
    if (src_id is None) == (dst_id is None):
        raise InvalidRequestError("cp: exactly one of SRC and DST must be ID:/path")
    sb = client(args).sandboxes.connect(src_id or dst_id or "")
    if dst_id is not None:
        local = Path(src)
        if local.is_dir():
            sb.upload(local, dst)
        elif local.is_file():
            target = posixpath.join(dst, local.name) if dst.endswith("/") else dst
            with open(local, "rb") as f:
                sb.write_file(target, f, mode=local.stat().st_mode & 0o777)
        else:
            raise InvalidRequestError(f"cp: {src}: no such local file or directory")
        return 0
    _copy_out(sb, src, Path(dst))
    return 0


def _copy_out(sb: Sandbox, remote: str, local: Path) -> None:
    chunks = sb.iter_file(remote)
    try:
        first = next(chunks, b"")
    except PathError as exc:
        if exc.reason != "IS_A_DIRECTORY":
            raise
        result = sb.download(remote, local)
        if result.skipped_links:
            print(
                f"orchard: skipped {len(result.skipped_links)} link(s) pointing outside {local} "
                f"(e.g. {result.skipped_links[0]})",
                file=sys.stderr,
            )
        return
    target = local / posixpath.basename(remote.rstrip("/")) if local.is_dir() else local
    with open(target, "wb") as f:
        f.write(first)
        for chunk in chunks:
            f.write(chunk)


def _when(value: dt.datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _format_row(info: SandboxInfo) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in sorted(info.labels.items())) or "-"
    return [
        info.id, info.state, info.image or "(default)", f"{info.cpu:g}",
        f"{info.memory_bytes / (1 << 20):.0f}Mi", _when(info.created_at), _when(info.expires_at), labels,
    ]  # fmt: skip


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def cmd_ls(args: argparse.Namespace) -> int:
    infos = client(args).sandboxes.list(pairs(args.label, "--label"))
    if args.json:
        print_lines(infos)
        return 0
    if args.quiet:
        for info in infos:
            print(info.id)
        return 0
    header = ["ID", "STATE", "IMAGE", "CPU", "MEMORY", "CREATED", "EXPIRES", "LABELS"]
    print_table(header, [_format_row(i) for i in infos])
    return 0


def cmd_kill_all(args: argparse.Namespace) -> int:
    sb = client(args).sandboxes.connect(args.id)
    print(sb.kill_all(args.signal))
    return 0
