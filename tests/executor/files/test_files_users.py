"""lookup_user reads the sandbox's own user database, confined."""

from __future__ import annotations

import os

import grpc
import pytest
from orchard.executor.files import lookup_user

from orchard.common.errors import ServiceError

from .conftest import Sandbox, run


def write_group(sandbox: Sandbox) -> None:
    (sandbox.root / "etc/group").write_text("root:x:0:\nstaff:x:50:agent\n")


@pytest.mark.parametrize(
    ("user", "expect"),
    [
        ("", (0, 0, "/root")),
        ("root", (0, 0, "/root")),
        ("agent", (1000, 1000, "/home/agent")),
        ("1000", (1000, 1000, "/home/agent")),
        ("4242", (4242, 0, "/")),
        ("4242:7", (4242, 7, "/")),
        ("agent:staff", (1000, 50, "/home/agent")),
        ("agent:0", (1000, 0, "/home/agent")),
    ],
)
def test_lookups(sandbox: Sandbox, user: str, expect: tuple[int, int, str]) -> None:
    write_group(sandbox)
    assert lookup_user(sandbox.root, user) == expect
    assert run(sandbox.files.lookup_user(user)) == expect


@pytest.mark.parametrize("user", ["nobody", "agent:nogroup"])
def test_unknown_names(sandbox: Sandbox, user: str) -> None:
    write_group(sandbox)
    with pytest.raises(ServiceError) as info:
        lookup_user(sandbox.root, user)
    assert (info.value.code, info.value.reason) == (grpc.StatusCode.NOT_FOUND, "USER_NOT_FOUND")


@pytest.mark.parametrize("user", [":", "agent:", ":5", "99999999999"])
def test_malformed(sandbox: Sandbox, user: str) -> None:
    with pytest.raises(ServiceError) as info:
        lookup_user(sandbox.root, user)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_passwd_symlinked_to_host_is_read_in_root(sandbox: Sandbox) -> None:
    (sandbox.root / "etc/passwd").unlink()
    (sandbox.root / "etc/passwd").symlink_to("/etc/passwd")  # in-root: a link to itself
    with pytest.raises(ServiceError) as info:
        lookup_user(sandbox.root, "agent")
    assert "symbolic link" in info.value.message  # ELOOP, not the host's passwd
    (sandbox.root / "etc/passwd").unlink()
    fake = sandbox.host / "passwd"
    fake.write_text("agent:x:0:0::/:/bin/sh\n")
    (sandbox.root / "etc/passwd").symlink_to(fake)  # absent in-root
    with pytest.raises(ServiceError) as info:
        lookup_user(sandbox.root, "agent")
    assert info.value.reason == "USER_NOT_FOUND"
    assert lookup_user(sandbox.root, "1000") == (1000, 0, "/")


def test_passwd_fifo_does_not_hang(sandbox: Sandbox) -> None:
    (sandbox.root / "etc/passwd").unlink()
    os.mkfifo(sandbox.root / "etc/passwd")
    with pytest.raises(ServiceError) as info:
        lookup_user(sandbox.root, "agent")
    assert info.value.reason == "UNSUPPORTED_FILE_TYPE"
