"""Warm pools end to end: a real ``orchard up`` with a templates.toml, the SDK and the CLI (real runc)."""

from __future__ import annotations

from pathlib import Path

import orchard
from tests.stack import REQUIRES_STACK, running_stack

from .waiting import wait_for

pytestmark = REQUIRES_STACK


def test_claims_through_the_sdk_and_pool_ls(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "templates.toml").write_text(
        '[templates.py]\nmemory_bytes = 268435456\nenv = { FROM = "template" }\nmin = 2\nmax = 4\n'
    )
    with running_stack(home) as stack:
        key = (home / "dev-api-key").read_text().strip()
        client = orchard.Orchard(stack.endpoint, key)
        wait_for(lambda: client.pools.list()[0].ready == 2, timeout=60, what="2 warm members")
        with client.sandboxes.create(
            template="py",
            env={"TASK": "t-1"},
            labels={"batch": "b1"},
            files={"/work/task.txt": b"solve me"},
            ttl=120,
        ) as sb:
            info = sb.last_info
            assert info.state == "claimed" and info.template == "py"
            out = sb.exec("echo $FROM $TASK; cat /work/task.txt")
            assert out.stdout_text == "template t-1\nsolve me", out
            before = sb.info().expires_at
            renewed = sb.keepalive(600)
            assert before is not None and renewed.expires_at is not None
            assert renewed.expires_at > before
        pools = client.pools.list()
        assert (pools[0].hits, pools[0].misses) == (1, 0)
        # A hint grows the pool to its max; the CLI shows it.
        client.pools.hint("py", 4, within=10)
        wait_for(lambda: client.pools.list()[0].ready == 4, timeout=60, what="4 warm")
        table = stack.cli("pool", "ls", check=True).stdout.splitlines()
        assert table[0].split()[:3] == ["TEMPLATE", "IMAGE", "READY"]
        assert table[1].split()[:3] == ["py", "(default)", "4"]
        refused = stack.cli("pool", "hint", "nope", "3")
        assert refused.returncode == 1 and "template 'nope' not found" in refused.stderr
