"""``OrchardSandbox``: slime's agent ``Sandbox`` protocol on an Orchard sandbox.

slime (THUDM/slime, git only) runs agent rollouts against ``slime.agent.sandbox.Sandbox``,
a small async protocol whose only implementation there talks to E2B. This class
satisfies it with the public SDK alone, so a rollout swaps ``E2BSandbox(image)`` for
``OrchardSandbox(image)``::

    async with OrchardSandbox("debian:bookworm") as sb:
        rc, out, err = await sb.exec("make test", user="agent", timeout=600)

It needs no extra: slime is not a package we can depend on, and nothing here imports
it. What each call does is what slime's source defines (``slime/agent/sandbox.py`` at
624b824a898ab0ec1fcb4d373004c7f3852bf515: the protocol, ``E2BSandbox`` and how
``examples/coding_agent_rl/swe.py`` uses it):

- ``exec`` returns ``(exit code, stdout, stderr)``; a non-zero exit with ``check=True``
  raises ``RuntimeError`` (as ``E2BSandbox.exec`` does); a command past its ``timeout``
  raises ``TimeoutError`` whatever ``check`` says (E2B raises its ``TimeoutException``
  there too; slime's rollouts abort the sample on either). Commands run under
  ``/bin/bash -c``, as E2B's envd runs them under bash.
- ``idempotent`` is the transport-retry hint: when the platform is unreachable
  (``orchard.ServiceUnavailableError``), an idempotent call is retried with
  jittered exponential backoff (``rpc_retries`` attempts, E2BSandbox's policy) and a
  non-idempotent one re-raises at once, since re-sending it could run the command
  twice. File calls and the create (sent with a fixed ``request_id``, so a retry
  returns the same sandbox) are idempotent.
- ``read_file`` of a path that does not exist returns ``""``: both slime
  implementations (E2BSandbox, the tests' FakeSandbox) do, and slime's SWE reward reads
  an optional result file that way. Any other failure raises.
- ``user`` is honoured: the root user uses Orchard's file calls; another user's
  ``write_file`` / ``read_file`` run as that user in the sandbox (``cat``), so file
  ownership and permissions are the ones E2B's per-user file API gives (a refused
  path raises ``PermissionError``).
- Infrastructure failures that outlast the retries are raised as Orchard's
  ``InfrastructureError`` family (slime has no type of its own; its rollouts treat any
  exception as an aborted sample, and ``err.is_infrastructure`` tells a trainer to
  drop it rather than score it).
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import orchard

logger = logging.getLogger(__name__)

ExecResult = tuple[int, str, str]
FileContent = str | bytes | Path
T = TypeVar("T")

_WRITE_AS_USER = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'


class OrchardSandbox:
    """An Orchard sandbox that satisfies ``slime.agent.sandbox.Sandbox``."""

    default_lifetime_sec = 3600
    default_rpc_retries = 6
    rpc_backoff_base_sec = 1.0
    rpc_backoff_cap_sec = 32.0

    def __init__(
        self,
        image: str | None = None,
        *,
        timeout: int | None = None,
        client: orchard.AsyncOrchard | None = None,
        cpu: float | str | None = None,
        memory: int | str | None = None,
        network: str | orchard.NetworkPolicy | None = None,
        env: Mapping[str, str] | None = None,
        rpc_retries: int | None = None,
    ) -> None:
        """``image`` None is the server's default image; ``timeout`` is the sandbox's
        lifetime in seconds (E2BSandbox's meaning; Orchard's ``ttl``). Without
        ``client`` one is made from the environment (``ORCHARD_ENDPOINT`` ...) and
        closed on exit."""
        self.image = image
        self.timeout = timeout if timeout is not None else self.default_lifetime_sec
        self.rpc_retries = max(
            1, rpc_retries if rpc_retries is not None else self.default_rpc_retries
        )
        self._client = client
        self._owns_client = client is None
        self._cpu, self._memory, self._network, self._env = cpu, memory, network, env
        self._sb: orchard.AsyncSandbox | None = None
        self.sandbox_id = ""

    # ---- lifecycle ------------------------------------------------------------

    async def __aenter__(self) -> OrchardSandbox:
        if self._client is None:
            self._client = orchard.AsyncOrchard()
        client = self._client
        request_id = uuid.uuid4().hex
        try:
            self._sb = await self._rpc_retry(
                "create",
                lambda: client.sandboxes.create(
                    image=self.image,
                    cpu=self._cpu,
                    memory=self._memory,
                    network=self._network,
                    ttl=self.timeout,
                    env=self._env,
                    request_id=request_id,
                ),
            )
        except BaseException:
            await self._close_client()
            raise
        self.sandbox_id = self._sb.id
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._sb is not None:
                await self._rpc_retry("delete", self._sb.delete)
        except orchard.SandboxNotFoundError:
            pass  # already gone (TTL, deleted elsewhere): the goal of the delete
        except orchard.OrchardError as e:
            # as E2BSandbox: a failed teardown must not hide the rollout's own outcome;
            # the sandbox's TTL still ends it
            logger.warning("[orchard.slime] delete %s failed: %s", self.sandbox_id, e)
        finally:
            self._sb = None
            await self._close_client()

    async def _close_client(self) -> None:
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            await client.close()

    @property
    def sandbox(self) -> orchard.AsyncSandbox:
        """The Orchard sandbox behind this one (inside ``async with``)."""
        if self._sb is None:
            raise RuntimeError("OrchardSandbox is used outside its 'async with' block")
        return self._sb

    # ---- the protocol ---------------------------------------------------------

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: dict[str, str] | None = None,
        timeout: int = 120,  # noqa: ASYNC109 (slime's protocol: the command's own timeout)
        check: bool = False,
        idempotent: bool = True,
    ) -> ExecResult:
        sb = self.sandbox
        result = await self._rpc_retry(
            f"exec({cmd[:60]!r})",
            lambda: sb.exec(["/bin/bash", "-c", cmd], timeout=timeout, env=env, user=_user(user)),
            idempotent=idempotent,
        )
        if result.timed_out:
            raise TimeoutError(f"orchard exec timed out after {timeout}s: {cmd[:120]}")
        if check and result.exit_code != 0:
            raise RuntimeError(
                f"orchard exec failed (exit={result.exit_code}): {cmd[:120]}\n"
                f"{result.stderr_text[:400]}"
            )
        return result.exit_code, result.stdout_text, result.stderr_text

    async def write_file(
        self, sandbox_path: str, content: FileContent, *, user: str = "root"
    ) -> None:
        sb = self.sandbox
        if _user(user) is None:
            if isinstance(content, Path):
                await self._rpc_retry(
                    f"write_file({sandbox_path} <- {content.name})",
                    lambda: _write_host_file(sb, sandbox_path, content),
                )
            else:
                await self._rpc_retry(
                    f"write_file({sandbox_path})", lambda: sb.write_file(sandbox_path, content)
                )
            return
        data = await asyncio.to_thread(content.read_bytes) if isinstance(content, Path) else content
        result = await self._rpc_retry(
            f"write_file({sandbox_path})",
            lambda: sb.exec(
                ["sh", "-c", _WRITE_AS_USER, "sh", sandbox_path], stdin=data, user=user, timeout=600
            ),
        )
        if result.exit_code != 0:
            raise _file_error(sandbox_path, user, result.stderr_text)

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str:
        sb = self.sandbox
        if _user(user) is None:
            try:
                data = await self._rpc_retry(
                    f"read_file({sandbox_path})", lambda: sb.read_file(sandbox_path)
                )
            except orchard.PathNotFoundError:
                return ""
            return data.decode("utf-8", errors="replace")
        result = await self._rpc_retry(
            f"read_file({sandbox_path})",
            lambda: sb.exec(["cat", "--", sandbox_path], user=user, timeout=600),
        )
        if result.exit_code != 0:
            if "No such file or directory" in result.stderr_text:
                return ""
            raise _file_error(sandbox_path, user, result.stderr_text)
        return result.stdout_text

    # ---- retries ----------------------------------------------------------------

    async def _rpc_retry(
        self, op_name: str, call: Callable[[], Awaitable[T]], *, idempotent: bool = True
    ) -> T:
        """``call()``, retried while the platform is unreachable if it is safe to replay."""
        for attempt in range(self.rpc_retries):
            try:
                return await call()
            except orchard.ServiceUnavailableError as e:
                if not idempotent or attempt + 1 == self.rpc_retries:
                    raise
                ceiling = min(self.rpc_backoff_cap_sec, self.rpc_backoff_base_sec * 2**attempt)
                backoff = random.uniform(0.0, ceiling)
                logger.debug(
                    "[orchard.slime] %s unavailable, retry %d/%d in %.1fs: %s",
                    op_name,
                    attempt + 1,
                    self.rpc_retries,
                    backoff,
                    e,
                )
                await asyncio.sleep(backoff)
        raise AssertionError("unreachable: the last attempt returns or raises")


def _user(user: str) -> str | None:
    """Orchard's user argument: None is the image's default user, root."""
    return None if user in ("root", "0") else user


async def _write_host_file(sb: orchard.AsyncSandbox, sandbox_path: str, host_path: Path) -> None:
    f = await asyncio.to_thread(open, host_path, "rb")  # streamed by the SDK in chunks
    try:
        await sb.write_file(sandbox_path, f)
    finally:
        await asyncio.to_thread(f.close)


def _file_error(path: str, user: str, stderr: str) -> OSError:
    message = f"{path} (as {user}): {stderr.strip()}"
    if "Permission denied" in stderr:
        return PermissionError(message)
    if "No such file or directory" in stderr:
        return FileNotFoundError(message)
    return OSError(message)
