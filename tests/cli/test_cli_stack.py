"""The CLI's listings, ``info``, ``create --template`` and ``rm`` selections on a real stack.

One ``orchard up`` (real processes, runc sandboxes) with a one-template
``templates.toml``; every command runs as a user would run it (a subprocess of
``python -m orchard.cli`` with the stack's home in its environment). The
confirmation of ``rm --all`` is answered on a real pseudo-terminal (``pty``),
since that is what the command asks on.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from orchard import __version__
from tests.scheduler.waiting import wait_for
from tests.stack import ORCHARD, REQUIRES_STACK, Stack, running_stack

pytestmark = REQUIRES_STACK


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("cli") / "home"
    home.mkdir()
    (home / "templates.toml").write_text(
        '[templates.small]\nmemory_bytes = 268435456\nenv = { FROM = "template" }\nmin = 1\nmax = 2\n'
    )
    with running_stack(home) as running:
        yield running


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def _ids(stack: Stack) -> set[str]:
    return set(stack.cli("ls", "-q", check=True).stdout.split())


def test_version(stack: Stack) -> None:
    assert stack.cli("--version", check=True).stdout.strip() == f"orchard {__version__}"


def test_global_flags_after_the_subcommand_reach_the_server(stack: Stack) -> None:
    key = (stack.home / "dev-api-key").read_text().strip()
    assert stack.cli("ls", "--endpoint", stack.endpoint, "--api-key", key).returncode == 0
    for argv in (["ls", "--api-key", "wrong"], ["image", "ls", "--api-key", "wrong"]):
        refused = stack.cli(*argv)
        assert refused.returncode == 1 and "invalid API key" in refused.stderr, argv
    unreachable = stack.cli("ls", "--endpoint", "grpcs://127.0.0.1:1", "--tls-ca", "/no/ca.pem")
    assert unreachable.returncode == 1 and "/no/ca.pem" in unreachable.stderr


def test_ls_and_info_as_json_and_text(stack: Stack) -> None:
    sandbox_id = stack.cli(
        "create", "--label", "suite=cli", "--env", "X=1", "--ttl", "300", check=True
    ).stdout.strip()
    try:
        rows = _lines(stack.cli("ls", "--json", "--label", "suite=cli", check=True).stdout)
        assert [r["id"] for r in rows] == [sandbox_id]
        assert rows[0]["state"] == "ready" and rows[0]["labels"] == {"suite": "cli"}
        assert rows[0]["created_at"].endswith("+00:00")

        info = json.loads(stack.cli("info", sandbox_id, "--json", check=True).stdout)
        assert (info["id"], info["state"], info["env"]) == (sandbox_id, "ready", {"X": "1"})
        assert info["executor_address"] and info["token_expires_at"]
        assert info["ttl_seconds"] == 300 and info["network"]["mode"] == "none"
        assert "token" not in info  # a credential: not printed

        text = stack.cli("info", sandbox_id, check=True).stdout
        fields = dict(line.split(":", 1) for line in text.splitlines())
        assert fields["id"].strip() == sandbox_id and fields["labels"].strip() == "suite=cli"
        assert fields["env"].strip() == "X=1"
    finally:
        stack.cli("rm", sandbox_id, check=True)
    gone = json.loads(stack.cli("info", sandbox_id, "--json", check=True).stdout)
    assert gone["state"] in ("deleting", "deleted")  # the control plane still knows it
    missing = stack.cli("info", "sb-doesnotexist")
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_image_and_pool_listings_as_json(stack: Stack) -> None:
    images = _lines(stack.cli("image", "ls", "--json", check=True).stdout)
    assert sum(i["is_default"] for i in images) == 1 and images[0]["size_bytes"] > 0
    wait_for(
        lambda: _lines(stack.cli("pool", "ls", "--json", check=True).stdout)[0]["ready"] >= 1,
        timeout=60,
        what="a warm member",
    )
    pools = _lines(stack.cli("pool", "ls", "--json", check=True).stdout)
    assert [p["template"] for p in pools] == ["small"]
    hinted = _lines(stack.cli("pool", "hint", "small", "2", "--json", check=True).stdout)
    assert hinted[0]["template"] == "small"


def test_create_from_a_template(stack: Stack) -> None:
    sandbox_id = stack.cli("create", "--template", "small", "--env", "T=2", check=True).stdout
    sandbox_id = sandbox_id.strip()
    try:
        info = json.loads(stack.cli("info", sandbox_id, "--json", check=True).stdout)
        assert (info["template"], info["memory_bytes"]) == ("small", 268435456)
        out = stack.cli("exec", sandbox_id, "--", "sh", "-c", "echo $FROM $T", check=True)
        assert out.stdout == "template 2\n"
    finally:
        stack.cli("rm", sandbox_id, check=True)
    unknown = stack.cli("create", "--template", "nope")
    assert unknown.returncode == 1 and "nope" in unknown.stderr
    both = stack.cli("create", "--template", "small", "--memory", "1Gi")
    assert both.returncode == 1 and "set by the template" in both.stderr


def _on_a_terminal(stack: Stack, argv: list[str], answer: bytes) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as stdin, answer its question, return (code, stderr)."""
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            [*ORCHARD, *argv],
            env=stack.env,
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.write(leader, answer)
        _, err = process.communicate(timeout=60)
    finally:
        os.close(leader)
        os.close(follower)
    return process.returncode, err.decode()


def test_rm_by_label_and_all(stack: Stack) -> None:
    batch = [stack.cli("create", "--label", "run=r1", check=True).stdout.strip() for _ in range(2)]
    other = stack.cli("create", "--label", "run=r2", check=True).stdout.strip()

    refused = stack.cli("rm", "--label", "run=r1")  # stdin is /dev/null: no terminal
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert set(batch) | {other} <= _ids(stack)

    deleted = stack.cli("rm", "--label", "run=r1", "--yes", check=True)
    assert sorted(deleted.stdout.split()) == sorted(batch)
    left = _ids(stack)
    assert other in left and not set(batch) & left

    none = stack.cli("rm", "--label", "run=r1", "--yes", check=True)
    assert none.stdout == "" and "no sandboxes match" in none.stderr

    code, err = _on_a_terminal(stack, ["rm", "--all"], b"n\n")
    assert code == 1 and "Delete" in err and "nothing deleted" in err
    assert other in _ids(stack)

    code, err = _on_a_terminal(stack, ["rm", "--all"], b"y\n")
    assert code == 0, err
    assert _ids(stack) == set()
