"""Sandbox root is not host root: per-uid kernel limits stop at each sandbox (issue 12, class 4).

The attack: one sandbox opens inotify instances until the kernel refuses
(``fs.inotify.max_user_instances``, 128 here). Without user namespaces every
sandbox's root is host uid 0, so the attacker took all of host root's instances
and a neighbour sandbox and the host's root then got EMFILE. With
user namespaces (the default; ``ORCHARD_USERNS=0`` turns them off) each sandbox runs on its own host uid range, in a namespace
owned by that range's first uid, so the attacker exhausts only its own count.

Real ``orchard up`` stack, real runc, GNU ``tail -f`` as the inotify user (one
instance per tail; it says "inotify cannot be used" when refused), on a file in
/dev/shm: coreutils counts overlayfs as remote and polls there without inotify.

Also here: the uid mapping seen from the host and inside, files written through
the API owned by the sandbox's root or the requested user, the image layers
still shared (not copied), and a nested user namespace still refused by seccomp.
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

pytestmark = [*REQUIRES_STACK, pytest.mark.reliability]

REFUSED = "inotify cannot be used"
ATTACK_TAILS = 160


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The default (ORCHARD_USERNS unset), in pytest's tmp dir, which is 0700: runc
    # reaches the sandbox's root through /run/orchard-userns, not through the home's
    # parents (userns.reachable_bundle).
    home = tmp_path_factory.mktemp("userns") / "home"
    assert any(folder.stat().st_mode & 0o001 == 0 for folder in home.parent.parents), (
        "the test means a home whose parents others cannot search"
    )
    # ORCHARD_TEST_USERNS=0 runs the same attacks without user namespaces: they fail
    # (what this test proves is the namespaces' doing). Beware: the attack then takes
    # host root's inotify instances for a few seconds, machine-wide.
    setting = os.environ.get("ORCHARD_TEST_USERNS")
    extra = {} if setting is None else {"ORCHARD_USERNS": setting}
    with running_stack(home, extra) as running:
        yield running


def _create(stack: Stack, **kwargs: object) -> Sandbox:
    key = (stack.home / "dev-api-key").read_text().strip()
    return Orchard(stack.endpoint, key).sandboxes.create(ttl=600, **kwargs)  # type: ignore[arg-type]


def _host_inotify_works() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        return False
    os.close(fd)
    return True


def _probe(sandbox: Sandbox) -> str:
    """stderr of one ``tail -f`` in the sandbox (it reports a refused inotify there)."""
    r = sandbox.exec("touch /dev/shm/w; timeout 1 tail -f /dev/shm/w >/dev/null; true")
    return r.stderr_text


def test_one_sandbox_exhausting_inotify_leaves_neighbour_and_host_root_theirs(
    stack: Stack,
) -> None:
    with _create(stack, pids=ATTACK_TAILS + 64) as attacker, _create(stack) as neighbour:
        assert REFUSED not in _probe(neighbour)
        r = attacker.exec(
            f"touch /dev/shm/w; for i in $(seq {ATTACK_TAILS}); do tail -f /dev/shm/w >/dev/null 2>>/tmp/err & "
            "done; sleep 2; grep -c 'inotify cannot be used' /tmp/err; true"
        )
        # The attack really ran: the attacker hit its own limit (128 instances here, so
        # ~32 of the tails were refused; exact counts vary by what else holds one).
        refused = int(r.stdout_text.strip() or "0")
        assert refused > 0, (r.stdout_text, r.stderr_text)
        try:
            assert REFUSED not in _probe(neighbour), "the neighbour lost its inotify instances"
            assert _host_inotify_works(), "host root lost its inotify instances"
        finally:
            attacker.exec("pkill tail; true")


def test_root_maps_to_an_unprivileged_range_per_sandbox(stack: Stack) -> None:
    with _create(stack) as one, _create(stack) as two:
        maps = []
        for sandbox in (one, two):
            line = sandbox.exec("cat /proc/self/uid_map").stdout_text.split()
            inside, host, size = (int(x) for x in line)
            assert inside == 0 and size == 65536 and host >= 65536
            maps.append(host)
            assert sandbox.exec("id -u").stdout_text.strip() == "0"
        assert abs(maps[0] - maps[1]) >= 65536, maps
        # The host sees the sandbox's processes as the range's uid, not root.
        status = Path(f"/proc/{_init_pid(stack, one.id)}/status").read_text().splitlines()
        uid_line = next(x for x in status if x.startswith("Uid:"))
        assert int(uid_line.split()[1]) == maps[0]


def _init_pid(stack: Stack, sandbox_id: str) -> int:
    meta = json.loads((stack.home / "sandboxes" / sandbox_id / "sandbox.json").read_text())
    return int(meta["init_pid"])


def test_files_written_through_the_api_belong_to_the_sandbox(stack: Stack) -> None:
    with _create(stack) as sandbox:
        sandbox.write_file("/tmp/by-api", b"hello")
        assert sandbox.exec("stat -c %u:%g /tmp/by-api").stdout_text.strip() == "0:0"
        sandbox.exec("mkdir -p /tmp/d && chown 1000:1000 /tmp/d")
        sandbox.write_file("/tmp/d/new", b"x")
        owner = sandbox.exec("stat -c %u:%g /tmp/d/new").stdout_text.strip()
        assert owner == "0:0", owner
        # The sandbox's root can change what the API wrote, as root of its own files.
        assert sandbox.exec("echo more >> /tmp/by-api && chown 1000 /tmp/by-api").exit_code == 0
        # The image's files are the image's owners, seen through the idmapped layers.
        assert sandbox.exec("stat -c %u /etc/passwd").stdout_text.strip() == "0"


def test_nested_user_namespace_still_refused(stack: Stack) -> None:
    with _create(stack) as sandbox:
        r = sandbox.exec("unshare --user true")
        assert r.exit_code != 0, r


def test_a_networked_sandbox_runs_in_its_namespace_too(stack: Stack) -> None:
    # Its network namespace is made on the host (owned by host root), then joined.
    with _create(stack, network="internet") as sandbox:
        r = sandbox.exec("cat /proc/self/uid_map /proc/net/dev")
        assert r.exit_code == 0, r
        first = r.stdout_text.split()
        assert first[0] == "0" and int(first[1]) >= 65536, r.stdout_text
        names = [line.split(":")[0].strip() for line in r.stdout_text.splitlines() if ":" in line]
        assert any(name != "lo" for name in names), names  # its veth end, not only loopback
