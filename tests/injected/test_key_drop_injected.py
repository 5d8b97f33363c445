"""A dropped token key's tokens stop working in sandboxes that run their own executor
(issue 12, class 6), on a real ``orchard up``, the way an operator drops one:
``orchard token-key rotate --drop KID`` on the node's home.

Before: the node executor reads the keyring, but an injected (runc) or runsc sandbox's
executor got its own derived keys once, at creation (``run/token.key``), and kept
them: a token signed with the dropped key (a leaked key is why one drops it) kept
running commands there until it expired, though the CLI promised "a dropped key's
tokens stop working at once". Now the scheduler sees the drop in the keyring
(``dropped`` in ``token-keys.json``) and sends each such sandbox a **key-drop notice**
(``d1``, ``scheduler/key_drops.py``) signed with a key id the sandbox still holds;
its executor forgets the dropped key. A sandbox left holding no live key (every key
it was given is dropped) cannot be told and could verify no new token: it is deleted.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from orchard import Orchard, Sandbox
from orchard._proto.orchard.v1 import executor_pb2 as pb
from tests.executor.harness import Client, error_reason
from tests.stack import REQUIRES_STACK, Stack, running_stack

from .runsc_footprint import force_delete_runsc

pytestmark = [*REQUIRES_STACK, pytest.mark.reliability]

# The scheduler looks at the keyring every 0.5 s (it re-reads it at most once a second).
DROPPED_WITHIN_SECONDS = 5.0
HAS_RUNSC = shutil.which("runsc") is not None

TEMPLATES = """
[templates.own]
runtime_class = "injected"
memory_bytes = 268435456
min = 0
max = 4

[templates.gvisor]
runtime_class = "runsc"
memory_bytes = 536870912
pids = 2048
min = 0
max = 2
"""
RUNTIMES = [
    "own",
    pytest.param(
        "gvisor",
        marks=pytest.mark.skipif(not HAS_RUNSC, reason="needs gVisor's runsc (Debian runsc)"),
    ),
]


@pytest.fixture(scope="module")
def stack(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("inj-key-drop")
    (home / "templates.toml").write_text(TEMPLATES)
    try:
        with running_stack(home, extra_env={"ORCHARD_EXECUTOR_BUNDLE": str(bundle)}) as running:
            yield running
    finally:
        if HAS_RUNSC:
            force_delete_runsc(home)


def token_key(stack: Stack, *args: str) -> str:
    return stack.cli("token-key", "--home", str(stack.home), *args, check=True).stdout.strip()


def held_token(stack: Stack, sb: Sandbox) -> tuple[str, str]:
    """(the sandbox's own executor's address, the token the SDK holds for it)."""
    _stub, access = sb._executor()
    assert access.address == f"unix:{stack.home.resolve()}/sandboxes/{sb.id}/run/executor.sock"
    return access.address, access.token


def run(client: Client, sandbox_id: str, token: str) -> grpc.StatusCode:
    request = pb.RunRequest(start=pb.ExecStart(sandbox_id=sandbox_id, argv=["true"]))
    try:
        client.stub.Run(request, metadata=client.metadata(sandbox_id, token), timeout=20)
    except grpc.RpcError as err:
        assert error_reason(err) == "TOKEN_INVALID", err
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def refused_within(client: Client, sandbox_id: str, token: str, within: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < within:
        if run(client, sandbox_id, token) == grpc.StatusCode.UNAUTHENTICATED:
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"the dropped key's token still ran commands {within} s after the drop")


@pytest.mark.parametrize("template", RUNTIMES)
def test_a_dropped_keys_token_stops_in_the_sandboxs_own_executor(
    stack: Stack, template: str
) -> None:
    """The sandbox holds two key ids (made after a rotation); its tokens are signed with the
    newer one. Dropping that one voids the held token (remembered by the executor: it ran a
    command before), while a token the scheduler issues now (the older key) still works."""
    key = stack.cli("tenant", "--home", str(stack.home), "create", f"kd-{template}", check=True)
    api = Orchard(stack.endpoint, key.stdout.strip())
    token_key(stack, "rotate")
    time.sleep(1.2)  # the scheduler re-reads the keyring at most once a second
    with api.sandboxes.create(template=template, ttl=600) as sb:
        address, token = held_token(stack, sb)
        kid = token.split(".")[1]
        client = Client(address, stack.home)
        try:
            assert run(client, sb.id, token) == grpc.StatusCode.OK
            token_key(stack, "rotate", "--drop", kid)
            took = refused_within(client, sb.id, token, DROPPED_WITHIN_SECONDS)
            print(f"{template}: the dropped key's token refused after {took:.2f} s")
            fresh = Orchard(stack.endpoint, key.stdout.strip()).sandboxes.connect(sb.id)
            _, new_token = held_token(stack, fresh)
            assert new_token.split(".")[1] != kid
            assert fresh.exec("echo live").stdout == b"live\n"
        finally:
            client.close()


def test_a_sandbox_left_with_no_live_key_is_deleted(stack: Stack) -> None:
    """Every key the sandbox was given is dropped: no notice it could verify can be signed,
    and no token it could verify can be issued, so the scheduler deletes it, saying why."""
    key = stack.cli("tenant", "--home", str(stack.home), "create", "kd-lonely", check=True)
    api = Orchard(stack.endpoint, key.stdout.strip())
    sb = api.sandboxes.create(template="own", ttl=600)
    address, token = held_token(stack, sb)
    client = Client(address, stack.home)
    folder = stack.home / "sandboxes" / sb.id
    try:
        assert run(client, sb.id, token) == grpc.StatusCode.OK
        ring = [line.split()[0] for line in token_key(stack, "ls").splitlines()]
        token_key(stack, "rotate", *[arg for kid in ring for arg in ("--drop", kid)])
        deadline = time.monotonic() + DROPPED_WITHIN_SECONDS + 10
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not folder.exists(), "a sandbox holding only dropped keys is still there"
    finally:
        client.close()
