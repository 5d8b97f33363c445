"""What every harness CLI of the tools layer shares: start it in the sandbox, map the outcome.

A CLI harness runs *inside* the sandbox (the tools layer at ``/opt/orchard/tools``, mounted
by ``sandboxes.create(..., tools=True)``) and talks only to the session's proxy URL it is
given. The subclass says how to configure the CLI (files and environment), its argv, and
how to read its own transcript; this base does the rest the same way for all five:

- a preflight ``<cli> --version``: a CLI that is missing (no layer) or does not start is
  ``Status.ABORTED`` with the reason, before any model call (never a zero reward);
- one run with the wall-time limit as the command's timeout: a timeout is ``TRUNCATED``;
  a non-zero exit whose output says the model endpoint failed is ``ABORTED``;
- the transcript files are read back and returned; ``steps`` is what the CLI's transcript
  counts (model calls), ``detail`` keeps the exit code and output tails.

Only the public SDK is used (``orchard.AsyncSandbox``): harnesses never reach the servers.
"""

from __future__ import annotations

import abc
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .._types import HarnessRun, Limits, ModelEndpoint, Status, Task

if TYPE_CHECKING:
    from orchard import AsyncSandbox, ExecResult

TOOLS = "/opt/orchard/tools"
BIN = f"{TOOLS}/bin"
RUN_DIR = "/var/tmp/orchard-harness"
"""Per-run files of the harness (config, its home, transcript), outside the repository."""
PLACEHOLDER_KEY = "orchard-session"
"""The API key CLIs insist on: the proxy's credential is the session path in the URL."""
_MCP_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class McpServer:
    """An MCP server the harness is told about (in its own config format): ``url`` (streamable
    HTTP, as a process in the sandbox reaches it) or ``command`` (argv of a stdio server the
    harness launches in the sandbox), exactly one of them."""

    url: str | None = None
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.url is None) == (not self.command):
            raise ValueError("an MCP server has a url or a command, exactly one of them")
        if self.url is not None and not re.match(r"^https?://[^\s]+$", self.url):
            raise ValueError(f"MCP server url {self.url!r} is not an http(s) URL")


def check_mcp_servers(servers: Mapping[str, McpServer]) -> dict[str, McpServer]:
    """The servers by name; a name must be a plain identifier (it becomes a config key and a
    prefix of the tools' names)."""
    for name, server in servers.items():
        if not _MCP_NAME.match(name):
            raise ValueError(f"MCP server name {name!r}: letters, digits, '_' and '-' only")
        if not isinstance(server, McpServer):
            raise TypeError(f"MCP server {name!r} is a {type(server).__name__}, not an McpServer")
    return dict(servers)


# Output that means the model endpoint (the proxy, the upstream) failed, not the agent.
_ENDPOINT_FAILURE = re.compile(
    r"(connection refused|ECONNREFUSED|could not connect|failed to connect|"
    r"connection error|APIConnectionError|stream disconnected|error sending request|"
    r"\b(401|403|404|5\d\d)\b.{0,40}(unauthori[sz]ed|forbidden|not found|error|status))",
    re.IGNORECASE,
)


def tail(data: bytes | str, limit: int = 4000) -> str:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return text[-limit:]


def json_lines(text: str) -> list[Any]:
    """The JSON values of ``text``'s lines; lines that are not JSON are skipped."""
    values: list[Any] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(("{", "[")):
            continue
        try:
            values.append(json.loads(line))
        except ValueError:
            continue
    return values


class CliHarness(abc.ABC):
    """Base of the tools-layer CLI harnesses (see the module docstring)."""

    name: ClassVar[str]
    command: ClassVar[str]
    """The wrapper in the layer's ``bin/``."""
    wire_format: ClassVar[str]
    """The model API it speaks: "responses", "messages" or "chat"."""
    needs_tools_layer: bool = True
    version_args: ClassVar[tuple[str, ...]] = ("--version",)
    """What proves the CLI starts (mini has no --version: its --help)."""

    def __init__(
        self, extra_args: tuple[str, ...] = (), mcp_servers: Mapping[str, McpServer] | None = None
    ) -> None:
        self.extra_args = tuple(extra_args)
        self.mcp_servers = check_mcp_servers(mcp_servers or {})
        """MCP servers the CLI is configured with (by the subclass, in its own format); a CLI
        whose adapter does not support them refuses them at construction."""
        if self.mcp_servers and not self.supports_mcp:
            raise ValueError(f"the {self.name} adapter does not configure MCP servers")

    supports_mcp: ClassVar[bool] = False
    """Whether :attr:`mcp_servers` reach the CLI's config (Codex, OpenClaw)."""

    # ---- what a subclass says -------------------------------------------------------

    def files(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        """Config files to write before the run (absolute path -> text)."""
        return {}

    def env(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        """The CLI's environment over the sandbox's (telemetry and update checks off)."""
        return {}

    @abc.abstractmethod
    def argv(self, task: Task, model: ModelEndpoint, limits: Limits) -> list[str]:
        """The CLI's command line for one non-interactive run of ``task``."""

    @abc.abstractmethod
    async def outcome(
        self, sandbox: AsyncSandbox, result: ExecResult, task: Task, limits: Limits
    ) -> HarnessRun:
        """Read the transcript after a run that exited by itself (not timed out)."""

    # ---- shared -------------------------------------------------------------------

    @property
    def executable(self) -> str:
        return f"{BIN}/{self.command}"

    def base_env(self) -> dict[str, str]:
        return {
            "HOME": f"{RUN_DIR}/home",
            "PATH": f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "NO_COLOR": "1",
            "TERM": "dumb",
            "CI": "1",
            "DO_NOT_TRACK": "1",
        }

    async def preflight(self, sandbox: AsyncSandbox) -> HarnessRun | None:
        """``<cli> --version`` in the sandbox; a HarnessRun(ABORTED) when it does not start."""
        try:
            probe = await sandbox.exec(
                [self.executable, *self.version_args], timeout=120, env=self.base_env()
            )
        except Exception as err:  # the SDK's own errors: the CLI is not there at all
            return self._aborted(f"{self.name}: could not start {self.executable}: {err}")
        if not probe.ok:
            hint = (
                " (was the sandbox created with tools=True?)"
                if probe.exit_code in (126, 127) or "No such file" in probe.stderr_text
                else ""
            )
            return self._aborted(
                f"{self.name}: `{self.command} {' '.join(self.version_args)}` failed "
                f"(exit {probe.exit_code})"
                f"{hint}: {tail(probe.stderr or probe.stdout, 1500)}"
            )
        return None

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: ModelEndpoint, limits: Limits
    ) -> HarnessRun:
        failed = await self.preflight(sandbox)
        if failed is not None:
            return failed
        try:
            await sandbox.exec(["mkdir", "-p", f"{RUN_DIR}/home"], timeout=30)
            for path, text in self.files(task, model, limits).items():
                await sandbox.write_file(path, text)
        except Exception as err:
            return self._aborted(f"{self.name}: could not write its configuration: {err}")
        env = {**self.base_env(), **dict(task.env), **self.env(task, model, limits)}
        argv = [*self.argv(task, model, limits), *self.extra_args]
        try:
            result = await sandbox.exec(argv, timeout=limits.max_seconds, cwd=task.workdir, env=env)
        except Exception as err:
            return self._aborted(f"{self.name}: the run failed to start or was lost: {err}")
        detail = {
            "argv": shlex.join(argv),
            "exit_code": result.exit_code,
            "stdout_tail": tail(result.stdout),
            "stderr_tail": tail(result.stderr),
            "seconds": result.status.duration_seconds,
        }
        if result.status.timed_out:
            run = await self._outcome_or_none(sandbox, result, task, limits)
            return HarnessRun(
                status=Status.TRUNCATED,
                steps=run.steps if run else 0,
                transcript=run.transcript if run else None,
                fault=f"{self.name}: stopped at the time limit ({limits.max_seconds:.0f} s)",
                detail=detail,
            )
        run = await self._outcome_or_none(sandbox, result, task, limits)
        if run is None:
            return self._aborted(
                f"{self.name}: exited {result.exit_code} without a transcript: "
                f"{tail(result.stderr or result.stdout, 1500)}",
                detail,
            )
        run.detail = {**detail, **dict(run.detail)}
        if run.status != Status.ABORTED and result.exit_code != 0 and self.endpoint_failed(result):
            run.status = Status.ABORTED
            run.fault = (
                f"{self.name}: the model endpoint failed (exit {result.exit_code}): "
                f"{tail(result.stderr or result.stdout, 1500)}"
            )
        return run

    async def _outcome_or_none(
        self, sandbox: AsyncSandbox, result: ExecResult, task: Task, limits: Limits
    ) -> HarnessRun | None:
        try:
            return await self.outcome(sandbox, result, task, limits)
        except FileNotFoundError:
            return None
        except Exception as err:  # an SDK error reading the transcript: infrastructure
            return self._aborted(f"{self.name}: could not read its transcript: {err}")

    @staticmethod
    def endpoint_failed(result: ExecResult) -> bool:
        return bool(
            _ENDPOINT_FAILURE.search(tail(result.stderr, 20000) + tail(result.stdout, 20000))
        )

    def _aborted(self, fault: str, detail: Mapping[str, Any] | None = None) -> HarnessRun:
        return HarnessRun(status=Status.ABORTED, fault=fault, detail=dict(detail or {}))

    async def read_text(self, sandbox: AsyncSandbox, path: str) -> str:
        """A file of the sandbox as text; FileNotFoundError when it is not there."""
        try:
            data = await sandbox.read_file(path)
        except FileNotFoundError:
            raise
        return data.decode("utf-8", errors="replace")
