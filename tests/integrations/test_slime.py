"""``orchard.integrations.slime.OrchardSandbox`` against slime's ``Sandbox`` protocol.

slime is git only (not on a registry), so its protocol is written out below as a
``typing.Protocol``, transcribed from THUDM/slime, ``slime/agent/sandbox.py`` at commit
624b824a898ab0ec1fcb4d373004c7f3852bf515 (class ``Sandbox``, lines 27-61). The
behaviour tests then run through a real stack: what ``E2BSandbox`` (same file) does
for ``check``, timeouts and ``idempotent`` retries, and what slime's callers
(``examples/coding_agent_rl/swe.py``) expect of ``read_file``.

The retry tests need the platform to become unreachable in the middle of a call: a
TCP relay on loopback sits between the client and the gateway (``data_plane="proxy"``
sends every call through it) and is cut and restored by the test, a real outage of
the connection rather than a faked error.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import pytest

import orchard
from orchard.integrations.slime import OrchardSandbox
from tests.stack import REQUIRES_STACK, Stack, running_stack

# ---- slime's protocol (transcribed; THUDM/slime@624b824a, slime/agent/sandbox.py) ----

ExecResult = tuple[int, str, str]
FileContent = str | bytes | Path


@runtime_checkable
class SlimeSandbox(Protocol):
    sandbox_id: str

    async def __aenter__(self) -> SlimeSandbox: ...

    async def __aexit__(self, exc_type, exc, tb) -> None: ...  # type: ignore[no-untyped-def]

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: dict[str, str] | None = None,
        timeout: int = 120,  # noqa: ASYNC109
        check: bool = False,
        idempotent: bool = True,
    ) -> ExecResult: ...

    async def write_file(
        self, sandbox_path: str, content: FileContent, *, user: str = "root"
    ) -> None: ...

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str: ...


PROTOCOL_METHODS = ("__aenter__", "__aexit__", "exec", "write_file", "read_file")


def test_the_class_satisfies_slimes_protocol_signature_by_signature() -> None:
    sb: SlimeSandbox = OrchardSandbox()  # what mypy would check for a slime user
    assert isinstance(sb, SlimeSandbox)
    assert sb.sandbox_id == ""
    for name in PROTOCOL_METHODS:
        ours = inspect.signature(getattr(OrchardSandbox, name))
        theirs = inspect.signature(getattr(SlimeSandbox, name))
        assert inspect.iscoroutinefunction(getattr(OrchardSandbox, name)), name
        assert [(p.name, p.kind, p.default) for p in ours.parameters.values()][1:] == [
            (p.name, p.kind, p.default) for p in theirs.parameters.values()
        ][1:], name  # [1:]: self
    assert inspect.signature(OrchardSandbox.exec).return_annotation == "ExecResult"
    assert inspect.signature(OrchardSandbox.read_file).return_annotation == "str"


# ---- behaviour, through a real stack ----------------------------------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("slime") / "home") as running:
        yield running


def _client(stack: Stack, endpoint: str | None = None, **kw: str) -> orchard.AsyncOrchard:
    key = (stack.home / "dev-api-key").read_text().strip()
    return orchard.AsyncOrchard(endpoint or stack.endpoint, key, **kw)


class TestOnARealStack:
    pytestmark = REQUIRES_STACK

    def test_exec_results_env_user_bash_and_check(self, stack: Stack) -> None:
        async def scenario() -> None:
            async with OrchardSandbox(client=_client(stack), timeout=600) as sb:
                assert sb.sandbox_id.startswith("sb-")
                rc, out, err = await sb.exec('echo "$X"; echo oops >&2; exit 4', env={"X": "1"})
                assert (rc, out, err) == (4, "1\n", "oops\n")
                # bash, as E2B's envd runs commands (slime's commands use bash-isms)
                assert (await sb.exec("[[ -n $BASH_VERSION ]] && id -un"))[1] == "root\n"
                assert (await sb.exec("id -un", user="nobody"))[1] == "nobody\n"
                with pytest.raises(
                    RuntimeError, match=r"exit=3\): false; echo bad >&2; exit 3\nbad"
                ):
                    await sb.exec("false; echo bad >&2; exit 3", check=True)
                assert (await sb.exec("true", check=True))[0] == 0

        asyncio.run(scenario())

    def test_a_command_past_its_timeout_raises_timeout_error(self, stack: Stack) -> None:
        async def scenario() -> None:
            async with OrchardSandbox(client=_client(stack)) as sb:
                started = time.monotonic()
                with pytest.raises(TimeoutError, match="timed out after 1s"):
                    await sb.exec("sleep 30", timeout=1)
                assert time.monotonic() - started < 20
                assert (await sb.exec("echo alive"))[1] == "alive\n"

        asyncio.run(scenario())

    def test_files_as_root_and_as_another_user(self, stack: Stack, tmp_path: Path) -> None:
        host = tmp_path / "big.bin"
        host.write_bytes(bytes(range(256)) * 4096)

        async def scenario() -> None:
            async with OrchardSandbox(client=_client(stack)) as sb:
                await sb.write_file("/work/deep/a.txt", "text")
                await sb.write_file("/work/b.bin", b"\x00\x01")
                await sb.write_file("/work/big.bin", host)
                assert await sb.read_file("/work/deep/a.txt") == "text"
                digest = (await sb.exec("sha256sum < /work/big.bin"))[1].split()[0]
                assert digest == hashlib.sha256(host.read_bytes()).hexdigest()
                # slime's callers read optional files: a missing one is "" (E2BSandbox)
                assert await sb.read_file("/work/missing.json") == ""
                # another user: the file is written and read as that user
                await sb.write_file("/tmp/n/own.txt", "mine", user="nobody")
                assert (await sb.exec("stat -c %U /tmp/n/own.txt"))[1] == "nobody\n"
                assert await sb.read_file("/tmp/n/own.txt", user="nobody") == "mine"
                assert await sb.read_file("/tmp/n/missing", user="nobody") == ""
                with pytest.raises(PermissionError, match="as nobody"):
                    await sb.write_file("/root/x.txt", "no", user="nobody")
                await sb.exec("echo secret > /root/s.txt && chmod 600 /root/s.txt", check=True)
                with pytest.raises(PermissionError):
                    await sb.read_file("/root/s.txt", user="nobody")
                with pytest.raises(orchard.PathError):
                    await sb.read_file("/work/deep")  # a directory: not "missing"

        asyncio.run(scenario())

    def test_idempotent_calls_are_replayed_after_an_outage_and_others_are_not(
        self, stack: Stack
    ) -> None:
        async def scenario() -> None:
            async with relay(stack.endpoint) as outage:
                client = _client(stack, f"127.0.0.1:{outage.port}", data_plane="proxy")
                async with OrchardSandbox(client=client, rpc_retries=12) as sb:
                    sb.rpc_backoff_base_sec, sb.rpc_backoff_cap_sec = 0.25, 2.0
                    cmd = "echo ran >> /tmp/runs; sleep 2"
                    # the response of a running command is severed: not safe to replay
                    outage.schedule(cut_at=0.7, restore_at=1.5)
                    with pytest.raises(orchard.ServiceUnavailableError):
                        await sb.exec(cmd, idempotent=False)
                    await outage.restored.wait()
                    assert (await sb.exec("wc -l < /tmp/runs"))[1] == "1\n"
                    # the same with idempotent=True: retried until the relay is back
                    outage.schedule(cut_at=0.7, restore_at=1.5)
                    assert (await sb.exec(cmd, idempotent=True))[0] == 0
                    assert (await sb.exec("wc -l < /tmp/runs"))[1] == "3\n"
                    # file calls are idempotent: a read during an outage comes back
                    outage.schedule(cut_at=0.0, restore_at=1.0)
                    await asyncio.sleep(0.1)
                    assert await sb.read_file("/tmp/runs") == "ran\nran\nran\n"

        asyncio.run(scenario())


class Relay:
    """A loopback TCP relay to the gateway that can drop every connection for a while."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.down = False
        self.restored = asyncio.Event()
        self.restored.set()
        self.writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        # ends when either side closes, or with the server at teardown (cancelled)
        with contextlib.suppress(OSError, asyncio.CancelledError):
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            self.writers |= {writer, up_writer}
            await asyncio.gather(self.pipe(reader, up_writer), self.pipe(up_reader, writer))

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
        self.writers.discard(writer)

    def schedule(self, cut_at: float, restore_at: float) -> None:
        loop = asyncio.get_running_loop()
        self.restored.clear()
        loop.call_later(cut_at, self.cut)
        loop.call_later(restore_at, self.restore)

    def cut(self) -> None:
        self.down = True
        for writer in list(self.writers):
            writer.transport.abort()

    def restore(self) -> None:
        self.down = False
        self.restored.set()


@contextlib.asynccontextmanager
async def relay(target: str) -> AsyncIterator[Relay]:
    outage = Relay(target)
    server = await asyncio.start_server(outage.handle, "127.0.0.1", 0)
    outage.port = server.sockets[0].getsockname()[1]
    try:
        yield outage
    finally:
        outage.cut()
        server.close()
        await server.wait_closed()
