"""What sandbox root is on the host under gVisor (issue 12, class 4), measured.

runsc sandboxes run without the user namespaces runc sandboxes get
(``userns.py``). These are the class-4 attacks of ``tests/reliability/
test_hostile_userns.py`` against a runsc sandbox on a real ``orchard up`` stack,
to show what gVisor's own isolation gives instead, and where it stops:

- the processes of the sandbox are not host processes: root inside is a uid of
  gVisor's Sentry, and the Sentry itself runs in its own user namespace as an
  unprivileged host uid (nobody), so per-uid limits the Sentry implements itself
  (inotify: the sandbox's ``tail -f`` instances) never touch the host's counts;
- but files the sandbox's root creates land on the host owned by host uid 0
  (the gofer, which runs as host root, creates them for the Sentry): on the
  host, sandbox root's files are root's files. They stay inside the sandbox's
  own folder (its overlay), which nothing on the host executes or trusts.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard import Orchard, Sandbox
from tests.stack import REQUIRES_STACK, Stack, running_stack

from .runsc_footprint import force_delete_runsc

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.reliability,
    pytest.mark.skipif(shutil.which("runsc") is None, reason="needs gVisor's runsc (Debian runsc)"),
]

TEMPLATES = """
[templates.gvisor]
runtime_class = "runsc"
memory_bytes = 1073741824
# Each gVisor task costs host tasks (ptrace platform): at 400 the Sentry's own forks
# were refused by the pids cgroup and the whole sandbox died.
pids = 8192
min = 0
max = 2
"""
REFUSED = "inotify cannot be used"
ATTACK_TAILS = 160


@pytest.fixture(scope="module")
def stack(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("runsc-userns")
    (home / "templates.toml").write_text(TEMPLATES)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ORCHARD_EXECUTOR_BUNDLE", str(bundle))
            mp.delenv("ORCHARD_USERNS", raising=False)  # the default
            with running_stack(home) as running:
                yield running
    finally:
        force_delete_runsc(home)


def _create(stack: Stack) -> Sandbox:
    key = (stack.home / "dev-api-key").read_text().strip()
    return Orchard(stack.endpoint, key).sandboxes.create(template="gvisor", ttl=600)


def _sentry_pid(stack: Stack, sandbox_id: str) -> int:
    root = next(stack.home.resolve().rglob(f"*{sandbox_id}*.state"))
    return int(json.loads(root.read_text())["sandbox"]["pid"])


def _status_ids(pid: int) -> tuple[int, str]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    uid = int(next(x for x in status if x.startswith("Uid:")).split()[1])
    return uid, Path(f"/proc/{pid}/uid_map").read_text().split("\n")[0].strip()


def _host_inotify_works() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_sandbox_root_is_not_a_host_root_process(stack: Stack) -> None:
    with _create(stack) as sandbox:
        assert sandbox.exec("id -u").stdout_text.strip() == "0"
        uid, uid_map = _status_ids(_sentry_pid(stack, sandbox.id))
        # The Sentry (the sandbox's kernel, where its root's processes live) is an
        # unprivileged host uid in a user namespace of its own.
        assert uid != 0, (uid, uid_map)
        assert uid_map.split()[:2] != ["0", "0"], uid_map


def test_inotify_exhaustion_stays_in_the_sandbox(stack: Stack) -> None:
    with _create(stack) as attacker, _create(stack) as neighbour:
        r = attacker.exec(
            f"touch /tmp/w; for i in $(seq {ATTACK_TAILS}); do tail -f /tmp/w >/dev/null "
            "2>>/tmp/err & done; sleep 3; grep -c 'inotify cannot be used' /tmp/err; "
            "ps -e | grep -c '[t]ail'; true"
        )
        lines = r.stdout_text.split()
        # The tails really run, and gVisor refused none (its own inotify, its own counts).
        assert len(lines) == 2 and int(lines[1]) >= ATTACK_TAILS, r
        try:
            probe = neighbour.exec("touch /tmp/w; timeout 1 tail -f /tmp/w >/dev/null; true")
            assert REFUSED not in probe.stderr_text, "the neighbour lost its inotify instances"
            assert _host_inotify_works(), "host root lost its inotify instances"
        finally:
            attacker.exec("pkill tail; true")


def test_files_sandbox_root_creates_are_host_root_files(stack: Stack) -> None:
    """The gap, measured: no uid mapping between the sandbox's files and the host."""
    with _create(stack) as sandbox:
        assert sandbox.exec("echo x > /opt/by-root && chown 0:0 /opt/by-root").exit_code == 0
        found = list((stack.home / "sandboxes" / sandbox.id).resolve().rglob("by-root"))
        assert found, "the file is not in the sandbox's folder on the host"
        assert {p.stat().st_uid for p in found} == {0}
