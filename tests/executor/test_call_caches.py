"""The per-call caches of the exec path keep their checks.

Remembered tokens are still refused once expired and only for the sandbox they
were verified for; the OOM counter read through a kept-open file sees changes
and survives its cgroup being removed; SDK stubs are built once per address.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from orchard.executor import oom
from orchard.executor.auth import CallAuthorizer

from orchard.client import Orchard
from orchard.common.errors import ServiceError
from orchard.common.tokens import Keyring, TokenClaims, TokenSigner

SANDBOX = "sb-cache-a"
OTHER = "sb-cache-b"


class CountingSigner(TokenSigner):
    """A real signer that counts how many times a signature was checked."""

    verified = 0

    def verify(self, token: str, sandbox_id: str, now: float | None = None) -> TokenClaims:
        type(self).verified += 1
        return super().verify(token, sandbox_id, now)


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def test_a_remembered_token_is_verified_once_and_refused_after_expiry() -> None:
    now = [1_000_000.0]
    signer = CountingSigner(Keyring.single(b"k" * 32))
    CountingSigner.verified = 0
    authorizer = CallAuthorizer(signer, clock=lambda: now[0])
    token, expiry = signer.issue(SANDBOX, 60, now=now[0], tenant="t1", max_execs=3)
    for _ in range(5):
        claims = authorizer.check(SANDBOX, _bearer(token))
        assert (claims.tenant, claims.max_execs, claims.expiry) == ("t1", 3, expiry)
    assert CountingSigner.verified == 1
    now[0] = expiry + 1
    with pytest.raises(ServiceError) as err:
        authorizer.check(SANDBOX, _bearer(token))
    assert err.value.reason == "TOKEN_INVALID" and "expired" in err.value.message


def test_a_remembered_token_is_only_good_for_its_sandbox() -> None:
    signer = TokenSigner.from_key(b"k" * 32)
    authorizer = CallAuthorizer(signer)
    token, _ = signer.issue(SANDBOX, 60)
    authorizer.check(SANDBOX, _bearer(token))
    with pytest.raises(ServiceError) as err:
        authorizer.check(OTHER, _bearer(token))
    assert err.value.reason == "TOKEN_INVALID"
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    with pytest.raises(ServiceError):
        authorizer.check(SANDBOX, _bearer(forged))


def _write_counter(directory: Path, kills: int) -> None:
    text = f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"
    # Rewrite in place (same inode), as the kernel's file changes under an open fd.
    with open(directory / "memory.oom_control", "r+" if kills else "w") as f:
        f.write(text)
        f.truncate()


def test_oom_counter_file_is_kept_open_and_reread(tmp_path: Path) -> None:
    counters = oom.OomCounters(capacity=2)
    dirs = [tmp_path / f"cg{i}" for i in range(3)]
    for d in dirs:
        d.mkdir()
        _write_counter(d, 0)
    assert counters.read(str(dirs[0])) == 0
    _write_counter(dirs[0], 4)
    assert counters.read(str(dirs[0])) == 4
    assert counters.read(str(dirs[1])) == 0
    assert counters.read(str(dirs[2])) == 0
    assert len(counters._fds) == 2  # the least recently used file was closed
    assert counters.read(str(tmp_path / "missing")) is None
    counters.close()
    assert not counters._fds


MEMORY_ROOT = Path("/sys/fs/cgroup/memory")


@pytest.mark.skipif(
    os.geteuid() != 0 or not (MEMORY_ROOT / "memory.oom_control").exists(),
    reason="needs root and the cgroup v1 memory controller",
)
def test_oom_counter_survives_its_cgroup_being_removed_and_recreated() -> None:
    cgroup = MEMORY_ROOT / f"orchard-test-oom-{os.getpid()}"
    counters = oom.OomCounters()
    cgroup.mkdir()
    try:
        assert counters.read(str(cgroup)) == 0
        cgroup.rmdir()  # an open counter file does not keep the cgroup alive
        assert counters.read(str(cgroup)) is None
        cgroup.mkdir()
        assert counters.read(str(cgroup)) == 0  # the stale file was dropped and reopened
    finally:
        counters.close()
        if cgroup.exists():
            cgroup.rmdir()


def test_sdk_stubs_are_built_once_per_address() -> None:
    client = Orchard("127.0.0.1:1", "key")
    first = client._executor("127.0.0.1:1")
    assert client._executor("127.0.0.1:1") is first
    assert client._executor("127.0.0.1:2") is not first
    assert client.transport.channel("127.0.0.1:1") is client.transport.channel("127.0.0.1:1")
    client.close()
    assert client._executor("127.0.0.1:1") is not first
    client.close()
