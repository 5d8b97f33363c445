"""The CLI exactly as the README says, against a real ``orchard up`` (real processes, runc).

``orchard up`` runs as a subprocess with a temporary ORCHARD_HOME and the shared
images folder (ORCHARD_IMAGES_DIR, default /var/lib/orchard/images, where
``make image`` builds the default image). The test drives create -> exec ->
cp both ways -> ls -> rm, checks outputs and exit codes, then stops
``orchard up`` by its pid and checks that nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with running_stack(tmp_path / "home") as running:
        yield running


def test_readme_walkthrough(stack: Stack, tmp_path: Path) -> None:
    assert (stack.home / "run" / "gateway.addr").read_text().strip() == stack.endpoint
    assert (stack.home / "dev-api-key").stat().st_mode & 0o777 == 0o600

    created = stack.cli("create", "--label", "suite=e2e", check=True)
    sandbox_id = created.stdout.strip()
    assert sandbox_id.startswith("sb-") and "\n" not in sandbox_id

    run = stack.cli("exec", sandbox_id, "--", "python3", "-c", "print(6*7)", check=True)
    assert run.stdout == "42\n"
    failing = stack.cli("exec", sandbox_id, "--", "sh", "-c", "echo oops >&2; exit 3")
    assert (failing.returncode, failing.stderr) == (3, "oops\n")
    assert stack.cli("exec", sandbox_id, "--timeout", "1", "--", "sleep", "30").returncode == 124
    assert stack.cli("exec", sandbox_id, "--", "sh", "-c", "kill -9 $$").returncode == 128 + 9
    env_cwd = stack.cli(
        "exec", sandbox_id, "--cwd", "/tmp", "--env", "X=1", "--", "sh", "-c", "pwd; echo $X"
    )
    assert env_cwd.stdout == "/tmp\n1\n"

    hello = tmp_path / "hello.txt"
    hello.write_text("hello\n")
    stack.cli("cp", str(hello), f"{sandbox_id}:/work/hello.txt", check=True)
    assert (
        stack.cli("exec", sandbox_id, "--", "cat", "/work/hello.txt", check=True).stdout
        == "hello\n"
    )
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.txt").write_text("a")
    (tree / "blob.bin").write_bytes(os.urandom(3 << 20))
    stack.cli("cp", str(tree), f"{sandbox_id}:/work/tree", check=True)
    copy = tmp_path / "work-copy"
    stack.cli("cp", f"{sandbox_id}:/work", str(copy), check=True)
    assert (copy / "hello.txt").read_text() == "hello\n"
    assert (copy / "tree" / "sub" / "a.txt").read_text() == "a"
    assert (copy / "tree" / "blob.bin").read_bytes() == (tree / "blob.bin").read_bytes()
    single = tmp_path / "single"
    single.mkdir()
    stack.cli("cp", f"{sandbox_id}:/work/hello.txt", str(single), check=True)
    assert (single / "hello.txt").read_text() == "hello\n"

    listing = stack.cli("ls", check=True).stdout
    assert sandbox_id in listing and "ready" in listing and "suite=e2e" in listing
    assert stack.cli("image", "ls", check=True).stdout.count("yes") == 1

    assert stack.cli("rm", sandbox_id, check=True).stdout.strip() == sandbox_id
    assert sandbox_id not in stack.cli("ls", check=True).stdout
    assert not (stack.home / "sandboxes" / sandbox_id).exists()


def test_bad_requests_give_clear_errors(stack: Stack) -> None:
    cases: list[tuple[list[str], str]] = [
        (["exec", "sb-doesnotexist", "--", "true"], "not found"),
        (["rm", "sb-doesnotexist"], "not found"),
        (["create", "--memory", "1"], "memory"),
        (["create", "--image", "no-such-image"], "no-such-image"),
        (["create", "--network", "allowlist"], "at least one cidr or domain"),
        (["create", "--label", "novalue"], "K=V"),
        (["cp", "/nonexistent-local", "sb-doesnotexist:/x"], "not found"),
        (["--api-key", "wrong", "ls"], "invalid API key"),
    ]
    for args, message in cases:
        result = stack.cli(*args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert result.stderr.startswith("orchard: "), result.stderr
    sandbox_id = stack.cli("create", check=True).stdout.strip()
    missing = stack.cli("exec", sandbox_id, "--", "no-such-command")
    assert missing.returncode != 0 and "Traceback" not in missing.stderr
    assert stack.cli("cp", f"{sandbox_id}:/no/such/file", "/tmp/x").returncode == 1


def test_stopping_up_leaves_nothing_behind(stack: Stack) -> None:
    ids = [stack.cli("create", check=True).stdout.strip() for _ in range(2)]
    assert all((stack.home / "sandboxes" / i).is_dir() for i in ids)
    stack.process.send_signal(signal.SIGTERM)
    assert stack.process.wait(90) == 0
    assert list((stack.home / "sandboxes").iterdir()) == []
    assert not (stack.home / "run" / "gateway.addr").exists()
    with open("/proc/self/mountinfo") as mounts:
        assert str(stack.home) not in mounts.read()
    runc_root = stack.home / "run" / "runc"
    listed = subprocess.run(
        ["runc", "--root", str(runc_root), "list", "-q"], capture_output=True, text=True
    )
    assert listed.stdout.strip() == ""
    leftover = subprocess.run(
        ["pgrep", "-f", f"--home {stack.home}"], capture_output=True, text=True
    )
    assert leftover.stdout.strip() == ""
