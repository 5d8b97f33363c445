"""Data-plane checks both proxies (the gateway's Python one and nginx) must pass."""

from __future__ import annotations

import time
from pathlib import Path

from orchard import ExecStatus, OutputChunk, Sandbox
from orchard._proto.orchard.v1 import executor_pb2


def run_request(sandbox_id: str, *argv: str) -> executor_pb2.RunRequest:
    return executor_pb2.RunRequest(
        start=executor_pb2.ExecStart(sandbox_id=sandbox_id, argv=list(argv))
    )


def bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


def processes(sb: Sandbox) -> str:
    """Every command line in the sandbox, one per line (read directly, not through a proxy)."""
    script = (
        "import os\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit():\n"
        "        try: print(open(f'/proc/{p}/cmdline','rb').read().replace(b'\\0', b' ').decode())\n"
        "        except OSError: pass\n"
    )
    return sb.exec(["python3", "-c", script]).stdout.decode()


def wait_gone(sb: Sandbox, marker: str, seconds: float) -> bool:
    """Whether no command line in the sandbox contains ``marker`` within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if marker not in processes(sb):
            return True
        time.sleep(0.1)
    return False


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


def check_files_and_tree(sb: Sandbox, tmp_path: Path, blob: bytes, files: int) -> None:
    """A file of ``blob`` written and read back, and a tree of ``files`` files (in
    folders of ten) uploaded and downloaded, through the proxy."""
    assert sb.write_file("/tmp/proxied.bin", blob) == len(blob)
    assert sb.read_file("/tmp/proxied.bin") == blob
    tree = tmp_path / "tree"
    folders = max(1, files // 10)
    for i in range(files):
        (tree / f"d{i % folders}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % folders}" / f"f{i}.txt").write_text(f"file {i}\n")
    sent, _ = sb.upload(tree, "/tmp/tree")
    assert sent == files
    back = tmp_path / "back"
    sb.download("/tmp/tree", back)
    assert sorted(p.relative_to(back) for p in back.rglob("*.txt")) == sorted(
        p.relative_to(tree) for p in tree.rglob("*.txt")
    )
    last = files - 1
    assert (back / f"d{last % folders}" / f"f{last}.txt").read_text() == f"file {last}\n"
