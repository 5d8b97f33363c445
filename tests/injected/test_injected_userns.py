"""Injected (runc) sandboxes' root is not host root (issue 12, class 4).

Before: runc sandboxes ran in a user namespace of their own uid range, but
sandboxes with their own executor (runtime class ``injected``) ran without one:
their root, and the executor inside, were host uid 0, so per-uid kernel limits
(inotify instances) were shared with host root and every other such sandbox, and
one sandbox could take them all. Now they get the same namespace as runc
sandboxes; the run folder and init's socket are given to the range's root.

The attacks of ``tests/reliability/test_hostile_userns.py`` against injected
sandboxes, on a real ``orchard up`` whose home's parents others cannot search
(runc reaches the bundle and the run folder through ``/run/orchard-userns``).
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard import Orchard, Sandbox
from tests.stack import REQUIRES_STACK, Stack, running_stack

from .sandbox_pids import SandboxPids

pytestmark = [*REQUIRES_STACK, pytest.mark.reliability]

REFUSED = "inotify cannot be used"
ATTACK_TAILS = 160
TEMPLATES = f"""
[templates.own]
runtime_class = "injected"
memory_bytes = 536870912
pids = {ATTACK_TAILS + 128}
min = 0
max = 4
"""


@pytest.fixture(scope="module")
def stack(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("inj-userns") / "home"
    home.mkdir()
    (home / "templates.toml").write_text(TEMPLATES)
    assert any(folder.stat().st_mode & 0o001 == 0 for folder in home.parent.parents)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("ORCHARD_USERNS", raising=False)  # the default
        with running_stack(home, {"ORCHARD_EXECUTOR_BUNDLE": str(bundle)}) as running:
            yield running


def _create(stack: Stack) -> Sandbox:
    key = (stack.home / "dev-api-key").read_text().strip()
    return Orchard(stack.endpoint, key).sandboxes.create(template="own", ttl=600)


def _init_pid(stack: Stack, sandbox_id: str) -> int:
    meta = json.loads((stack.home / "sandboxes" / sandbox_id / "sandbox.json").read_text())
    return int(meta["init_pid"])


def _host_uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(x for x in status if x.startswith("Uid:")).split()[1])


def _host_inotify_works() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        return False
    os.close(fd)
    return True


def _probe(sandbox: Sandbox) -> str:
    r = sandbox.exec("touch /dev/shm/w; timeout 1 tail -f /dev/shm/w >/dev/null; true")
    return r.stderr_text


def test_an_injected_sandboxs_root_and_executor_are_an_unprivileged_range(stack: Stack) -> None:
    with _create(stack) as one, _create(stack) as two:
        bases = []
        for sandbox in (one, two):
            inside, host, size = (
                int(x) for x in sandbox.exec("cat /proc/self/uid_map").stdout.split()
            )
            assert (inside, size) == (0, 65536) and host >= 65536, (inside, host, size)
            assert sandbox.exec("id -u").stdout_text.strip() == "0"
            init = _init_pid(stack, sandbox.id)
            assert _host_uid(init) == host
            [(executor, _)] = SandboxPids(init).find(b"orchard.executor\0--in-sandbox")
            assert _host_uid(executor) == host, "the executor inside runs as host root"
            bases.append(host)
            # It still works as an injected sandbox: its own executor, the key gone.
            listing = sandbox.exec("ls -a /.orchard/run").stdout_text.split()
            assert "token.key" not in listing and "executor.sock" in listing
            sandbox.write_file("/tmp/by-api", b"hello")
            assert sandbox.exec("stat -c %u:%g /tmp/by-api").stdout_text.strip() == "0:0"
        assert abs(bases[0] - bases[1]) >= 65536, bases


def test_one_injected_sandbox_exhausting_inotify_leaves_neighbour_and_host_root_theirs(
    stack: Stack,
) -> None:
    with _create(stack) as attacker, _create(stack) as neighbour:
        assert REFUSED not in _probe(neighbour)
        r = attacker.exec(
            f"touch /dev/shm/w; for i in $(seq {ATTACK_TAILS}); do "
            "tail -f /dev/shm/w >/dev/null 2>>/tmp/err & done; sleep 2; "
            "grep -c 'inotify cannot be used' /tmp/err; true"
        )
        refused = int(r.stdout_text.strip() or "0")
        assert refused > 0, (r.stdout_text, r.stderr_text)  # the attacker hit its own limit
        try:
            assert REFUSED not in _probe(neighbour), "the neighbour lost its inotify instances"
            assert _host_inotify_works(), "host root lost its inotify instances"
        finally:
            attacker.exec("pkill tail; true")
