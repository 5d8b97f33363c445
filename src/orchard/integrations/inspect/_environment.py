"""``OrchardSandboxEnvironment``: Inspect AI's sandbox contract on an Orchard sandbox.

One sample, one sandbox: ``sample_init`` creates it from the sample's
:class:`OrchardSandboxConfig`, ``sample_cleanup`` deletes it, ``task_cleanup``
deletes what an interrupted sample left (or, under ``--no-sandbox-cleanup``,
prints the ids it keeps). Inspect's own ``max_sandboxes`` semaphore bounds how
many exist at once; with none given, the tenant's sandbox quota is the default
(``default_concurrency``), and a create over quota waits for room.

Where Orchard's behaviour differs from Inspect's contract it is adapted here,
each in one place: a command killed by a signal reports ``128 + N`` (a shell's
convention, as Docker's provider gives); a timeout raises ``TimeoutError``; an
output cap hit raises ``OutputLimitExceededError``; relative paths and cwds
resolve against the per-sample ``working_dir``.
"""

from __future__ import annotations

import errno
import logging
import posixpath
import shlex
import stat
import sys
from typing import Any, ClassVar, Literal, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    sandboxenv,
)
from pydantic import BaseModel

import orchard

from ._config import OrchardSandboxConfig, resolve_config
from ._errors import inspect_error, inspect_errors

logger = logging.getLogger(__name__)

PROVIDER_LABEL = "inspect-ai/provider"
TASK_LABEL = "inspect-ai/task"
SAMPLE_LABEL = "inspect-ai/sample"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The PATH our own helper commands run with, never the image's (Inspect's rule)."""


@sandboxenv(name="orchard")
class OrchardSandboxEnvironment(SandboxEnvironment):
    """An Inspect sandbox that is one Orchard sandbox."""

    _client: ClassVar[orchard.AsyncOrchard | None] = None
    _quota_limit: ClassVar[int | None] = None
    _tasks: ClassVar[int] = 0
    """Tasks between task_init and task_cleanup: the last one out closes the client."""
    _live: ClassVar[dict[str, orchard.AsyncSandbox]] = {}
    """Sandboxes not yet cleaned up, by id. Inspect calls task_cleanup once per
    sandbox config at the end of the whole batch (named "shutdown", not by task),
    so what is left then is every sample's that was interrupted or kept."""

    def __init__(self, sandbox: orchard.AsyncSandbox, config: OrchardSandboxConfig) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.config = config
        self._no_stat_warned = False

    # ---- lifecycle ------------------------------------------------------------

    @classmethod
    def client(cls) -> orchard.AsyncOrchard:
        """The one client every sample shares (configured from the environment)."""
        if cls._client is None:
            cls._client = orchard.AsyncOrchard()
        return cls._client

    @classmethod
    def default_concurrency(cls) -> int | None:
        """The tenant's sandbox quota (None when unlimited): Inspect's default ``max_sandboxes``.

        Inspect asks at startup and again per sample; the quota is read once."""
        if cls._quota_limit is None:
            with orchard.Orchard() as client:
                cls._quota_limit = int(client.tenant().quota.get("max_sandboxes", 0))
        return cls._quota_limit or None

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return OrchardSandboxConfig.model_validate(config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Fail the task early on a bad config, an unreachable service or an unknown image."""
        cfg = resolve_config(config)
        cls._tasks += 1
        with inspect_errors():
            images = {i.name for i in await cls.client().images.list()}
        if cfg.image is not None and cfg.image not in images:
            raise ValueError(
                f"orchard: no image {cfg.image!r} (the server has: {', '.join(sorted(images))})"
            )

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        cfg = resolve_config(config)
        labels = {
            **cfg.labels,
            PROVIDER_LABEL: "orchard",
            TASK_LABEL: task_name[:256],
            SAMPLE_LABEL: str(metadata.get("__sample_id__", ""))[:256],
        }
        with inspect_errors():
            sb = await cls.client().sandboxes.create(
                image=cfg.image,
                cpu=cfg.cpu,
                memory=cfg.memory,
                network=None if cfg.template else cfg.network_policy(),
                ttl=cfg.ttl,
                labels=labels,
                env=cfg.env,
                pids=cfg.pids,
                template=cfg.template,
                wait_for_quota=cfg.wait_for_quota,
            )
        cls._live[sb.id] = sb
        env = cls(sb, cfg)
        try:
            made = await env.exec(["mkdir", "-p", "--", cfg.working_dir], cwd="/")
            if not made.success:
                raise RuntimeError(f"orchard: cannot make {cfg.working_dir}: {made.stderr}")
        except BaseException:
            await cls._delete(sb)
            raise
        return {"default": env}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for env in environments.values():
            if isinstance(env, OrchardSandboxEnvironment):
                await cls._delete(env.sandbox)

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        """Delete what samples left (interrupted ones); keep and list it under --no-sandbox-cleanup."""
        left = list(cls._live.values())
        cls._live.clear()
        if not cleanup:
            # stderr: with --display none Inspect keeps stdout machine-readable
            for sb in left:
                print(
                    f"Kept Orchard sandbox {sb.id} (remove: inspect sandbox cleanup orchard {sb.id})",
                    file=sys.stderr,
                )
        else:
            for sb in left:
                await cls._delete(sb)
        cls._tasks = max(0, cls._tasks - 1)
        if cls._tasks == 0 and cls._client is not None:
            client, cls._client = cls._client, None
            await client.close()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup orchard [ID]``: that sandbox, or every one Inspect made."""
        async with orchard.AsyncOrchard() as client:
            with inspect_errors():
                if id is not None:
                    await client.sandboxes.delete(id)
                    return
                for info in await client.sandboxes.list({PROVIDER_LABEL: "orchard"}):
                    if info.state not in ("deleting", "deleted"):
                        await client.sandboxes.delete(info.id)

    @classmethod
    async def _delete(cls, sb: orchard.AsyncSandbox) -> None:
        cls._live.pop(sb.id, None)
        try:
            await sb.delete()
        except orchard.SandboxNotFoundError:
            pass  # already gone (reaped by its ttl): what cleanup wanted
        except orchard.OrchardError as err:
            # Cleanup must not fail a scored sample; the ttl reaps it in the end.
            logger.warning("orchard: could not delete sandbox %s: %s", sb.id, err)

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """A shell in the sandbox from the ``orchard`` CLI (stdin forwarded; no terminal)."""
        as_user = f" --user {shlex.quote(user)}" if user else ""
        return SandboxConnection(
            type="orchard", command=f"orchard exec -i{as_user} {self.sandbox.id} -- bash -i"
        )

    # ---- operations -----------------------------------------------------------

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.config.working_dir, path))

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,  # noqa: ASYNC109 (Inspect's signature)
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        """Run ``cmd`` (an argv). ``timeout_retry`` is moot: the timeout is enforced
        inside the sandbox and is final, never a lost reply to retry; ``concurrency``
        throttles local subprocesses, and nothing here is one."""
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        argv = [cmd] if isinstance(cmd, str) else list(cmd)
        options: dict[str, Any] = {
            "timeout": timeout,
            "cwd": self._path(cwd) if cwd else self.config.working_dir,
            "env": env,
            "user": user,
            "max_output_bytes": limit,
        }
        try:
            with inspect_errors():
                if input is None:
                    result = await self.sandbox.exec(argv, **options)
                    status, out, err = result.status, result.stdout, result.stderr
                else:
                    status, out, err = await self._exec_with_input(argv, input, options)
        except orchard.CommandStartError as start_error:
            if start_error.reason == "USER_NOT_FOUND":
                # What `docker exec --user` gives: a failed result naming the user.
                return ExecResult(False, 126, "", f"{start_error.message}\n")
            raise
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        if status.timed_out:
            timeout_error = TimeoutError(f"Command timed out after {timeout} seconds")
            if stdout or stderr:
                timeout_error.truncated_output = stdout + stderr  # type: ignore[attr-defined]
            raise timeout_error
        if status.truncated:
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, truncated_output=stdout + stderr
            )
        # From the signal itself, whatever exit_code convention the SDK reports it in.
        code = 128 + status.signal if status.signal else status.exit_code
        if code == 126 and not stdout and stderr == f"orchard: {argv[0]}: Permission denied\n":
            raise PermissionError(errno.EACCES, "Permission denied", argv[0])
        return ExecResult(code == 0, code, stdout, stderr)

    async def _exec_with_input(
        self, argv: list[str], input: str | bytes, options: dict[str, Any]
    ) -> tuple[orchard.ExecStatus, bytes, bytes]:
        """Stdin goes through the streaming call: it is sent in chunks, so any size fits."""
        out, err = bytearray(), bytearray()
        status: orchard.ExecStatus | None = None
        async for event in self.sandbox.exec_stream(argv, stdin=input, **options):
            if isinstance(event, orchard.OutputChunk):
                (out if event.stream == "stdout" else err).extend(event.data)
            else:
                status = event
        if status is None:
            raise orchard.InfrastructureError(
                "the command's stream ended without its exit status", fault="infrastructure"
            )
        return status, bytes(out), bytes(err)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        with inspect_errors(file):
            await self.sandbox.write_file(self._path(file), contents, make_parents=True)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        path = self._path(file)
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        await self._check_readable(file, path, limit)
        data = bytearray()
        with inspect_errors(file):
            async for chunk in self.sandbox.iter_file(path):
                data.extend(chunk)
                if len(data) > limit:
                    raise _read_limit_error()
        return data.decode("utf-8") if text else bytes(data)

    async def _check_readable(self, file: str, path: str, limit: int) -> None:
        """What the file read alone cannot say: a file its owner may not read
        (root reads it anyway; Inspect's Docker provider reports it the same way),
        and a file over the limit, refused before any byte moves.

        One ``stat`` in the sandbox (the SDK has no stat call yet)."""
        probe = await self.exec(
            ["/bin/sh", "-c", f'PATH={SYSTEM_PATH} exec stat -L -c "%f %s" -- "$1"', "sh", path],
            cwd="/",
        )
        if probe.returncode == 127:
            if not self._no_stat_warned:
                logger.warning(
                    "orchard: no stat in sandbox %s: read_file cannot check modes", self.sandbox.id
                )
                self._no_stat_warned = True
            return
        if not probe.success:
            if "No such file" in probe.stderr:
                raise inspect_error(orchard.PathNotFoundError(probe.stderr), file)
            if "Permission denied" in probe.stderr:
                raise PermissionError(errno.EACCES, "Permission denied", file)
            return  # let the read itself report what stat could not
        raw_mode, size = probe.stdout.split()
        mode = int(raw_mode, 16)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        if not mode & stat.S_IRUSR:
            raise PermissionError(errno.EACCES, "Permission denied", file)
        if int(size) > limit:
            raise _read_limit_error()


def _read_limit_error() -> OutputLimitExceededError:
    return OutputLimitExceededError(
        SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
    )
