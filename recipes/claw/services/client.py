"""The driver's side of the Claw mock services: start them in a sandbox, call, audit, read state.

The services (mail, calendar, contacts, files, todo, web search, and the tau2 retail and
airline domains) run *inside* the task's sandbox as one background process of the image's
``python3`` (``orchard.recipes.claw.services.box``, stdlib only), with an optional MCP
server beside it (the PyPI ``mcp`` package). The agent reaches them as tools from wherever
its loop runs:

- a loop in the driver's process (the recipe's ReAct loop) gets :meth:`tool_specs` (OpenAI
  function tools) and runs each call with :meth:`call_tool` (carried over a port forward of
  the SDK: the sandbox's network stays ``none``);
- a harness inside the sandbox (Codex, OpenClaw, ...) calls the plain HTTP/JSON API at
  :attr:`http_base_in_sandbox` (with :attr:`claw_command_in_sandbox`, a ``claw <tool>
  '<json>'`` shell command: the default image has no ``curl``), or the MCP server at
  :attr:`mcp_url_in_sandbox` (streamable HTTP), or launches
  :attr:`mcp_stdio_command_in_sandbox` (MCP over stdio).

Every call, from any of these, lands in the service's **audit log** (service, operation,
arguments, status, time, mutating or not), which the grader reads with :meth:`audit`, with
the final state of every service (:meth:`state`).

The agent cannot write the audit log but through its calls: the log lives only in the
service process's memory (no file); the process makes itself non-dumpable before anything
else (root in a sandbox holds no ``CAP_SYS_PTRACE``, so its memory and descriptors are
closed); the admin calls (reset, audit, state) carry an HMAC of a secret the driver drew
and handed over on the process's stdin (never in argv, the environment or a file), and
every admin answer is signed with it, so an agent that kills the service and serves its
own on the port cannot forge an audit log: the driver raises :class:`ServicesTampered`.
An agent that kills the service is told apart too: :class:`ServicesLost`, with the
process's exit.

How the code gets into the sandbox: see :mod:`orchard.recipes.claw.services.runtime`.

Only the public SDK is used (``orchard.AsyncSandbox``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Self

from .fixtures import Fixtures

if TYPE_CHECKING:
    from orchard import AsyncProcess, AsyncSandbox


DEFAULT_PORT = 7790
DEFAULT_MCP_PORT = 7791
INSTALL_DIR = "/opt/orchard-claw"


class ServicesError(Exception):
    """Base of the services' errors. ``fault`` says whose: ``"infrastructure"`` (the
    runtime is not built, the sandbox failed) or ``"task"`` (the agent broke the services:
    killed them, replaced them)."""

    fault: str = "infrastructure"


class RuntimeNotBuilt(ServicesError):
    """The services' runtime (the ``mcp`` and tau2 packages for the sandbox's Python) is not
    built on this node: ``make claw-services``."""


class ServicesStartError(ServicesError):
    """The services did not come up (no ``python3`` in the image, a crash, no health)."""


class ServicesLost(ServicesError):
    """The service process is gone (killed, crashed) while the driver needed it."""

    fault = "task"


class ServicesTampered(ServicesError):
    """An admin answer was not signed by the services the driver started: something else
    answers on their port."""

    fault = "task"


class ServicesAdminError(ServicesError):
    """The services refused an admin call (bad fixtures, a limit): the message says why."""


@dataclass(frozen=True)
class AuditEntry:
    """One call the agent made, as the service recorded it.

    ``status`` is ``"ok"`` or ``"error"`` (``error`` then says ``"<code>: <message>"``);
    a call to an unknown tool or with invalid arguments is recorded too (``service`` is
    ``"?"`` for an unknown tool). ``mutating``: the operation changes state (send, create,
    delete, ...); ``destructive``: it removes or overwrites something that was there
    (delete, move to trash, overwrite a file, cancel an order). ``channel``: ``"http"``,
    ``"mcp"`` or ``"driver"`` (:meth:`ClawServices.call_tool`). ``time`` is the service's
    wall clock (Unix seconds), ``seq`` its order (from 1, no gaps).
    """

    seq: int
    time: float
    service: str
    operation: str
    arguments: Mapping[str, Any]
    status: Literal["ok", "error"]
    mutating: bool
    destructive: bool
    channel: str
    error: str | None = None
    result: Any = None
    """The call's result as the agent got it, cut to a few KiB (``{"truncated": ...}``)."""

    @property
    def tool(self) -> str:
        """The tool name the agent called (``<service>_<operation>``, or tau2's own name)."""
        return self.operation


@dataclass(frozen=True)
class Health:
    """The services' own report: which are up, the process id, how many calls so far."""

    ok: bool
    services: Sequence[str]
    pid: int
    calls: int
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceOptions:
    """Where and how the services run in the sandbox.

    ``mcp``: also start the MCP server (streamable HTTP on ``mcp_port``; costs ~1 s of
    start and ~40 MB: only harnesses that speak MCP need it). ``python``: the interpreter
    of the image. ``runtime``: the built runtime (None: the node's, under
    ``$ORCHARD_HOME``). ``start_timeout``: how long the services have to answer health.
    """

    port: int = DEFAULT_PORT
    mcp: bool = False
    mcp_port: int = DEFAULT_MCP_PORT
    python: str = "/usr/bin/python3"
    install_dir: str = INSTALL_DIR
    runtime: str | os.PathLike[str] | None = None
    start_timeout: float = 60.0
    call_timeout: float = 60.0


class ClawServices:
    """The services of one sandbox, from the driver. Make it with :meth:`start`; use it as
    an async context manager (or call :meth:`close`) so its port forward is closed."""

    def __init__(
        self,
        sandbox: AsyncSandbox,
        fixtures: Fixtures,
        options: ServiceOptions,
        secret: bytes,
        process: AsyncProcess,
        mcp_process: AsyncProcess | None,
    ) -> None:
        """Internal: use :meth:`start`."""
        self.sandbox = sandbox
        self.fixtures = fixtures
        self.options = options
        self._secret = secret
        self._process = process
        self._mcp_process = mcp_process
        self._tools: list[dict[str, Any]] = []
        self._forward: Any = None
        self._http: Any = None
        self._lock = asyncio.Lock()
        self.start_seconds: dict[str, float] = {}
        """How long each start phase took (``install``, ``process``, ``health``, ``reset``,
        ``mcp``), for the docs' figures."""

    # ---- lifecycle ------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        sandbox: AsyncSandbox,
        fixtures: Fixtures,
        options: ServiceOptions | None = None,
    ) -> ClawServices:
        """Install the services into ``sandbox`` (once per sandbox), start them as a
        background process, wait for their health, load ``fixtures`` and fetch the tool
        list. Raises :class:`RuntimeNotBuilt` (``make claw-services``) or
        :class:`ServicesStartError` (with the process's output) when they cannot come up."""
        from ._start import start_services

        return await start_services(cls, sandbox, fixtures, options or ServiceOptions())

    async def close(self) -> None:
        """Close the driver's port forward and HTTP client (the process lives on with the
        sandbox; :meth:`stop` ends it)."""
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._forward is not None:
            with contextlib.suppress(Exception):
                await self._forward.close()
            self._forward = None

    async def stop(self) -> None:
        """Kill the service processes and close (the sandbox's delete does it anyway)."""
        for process in (self._mcp_process, self._process):
            if process is not None:
                with contextlib.suppress(Exception):
                    await process.kill()
        await self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- where the agent reaches them -------------------------------------------------

    @property
    def http_base_in_sandbox(self) -> str:
        """The plain HTTP/JSON API as a process in the sandbox reaches it:
        ``GET {base}/v1/tools``, ``POST {base}/v1/tools/<name>`` with the arguments as a
        JSON object (see :meth:`usage`)."""
        return f"http://127.0.0.1:{self.options.port}"

    @property
    def mcp_url_in_sandbox(self) -> str:
        """The MCP server (streamable HTTP) inside the sandbox; started only with
        ``ServiceOptions(mcp=True)``."""
        return f"http://127.0.0.1:{self.options.mcp_port}/mcp"

    @property
    def mcp_stdio_command_in_sandbox(self) -> list[str]:
        """An MCP server over stdio (argv) a harness may launch itself; it carries each
        call to the HTTP API (so it lands in the same audit log, channel ``mcp``)."""
        d = self.options.install_dir
        return [
            self.options.python,
            "-I",
            f"{d}/claw_box/mcp_main.py",
            "--base",
            self.http_base_in_sandbox,
        ]

    @property
    def claw_command_in_sandbox(self) -> str:
        """The ``claw`` shell command in the sandbox: ``claw tools``, ``claw <tool>
        '<JSON arguments>'`` (the JSON answer on stdout; exit 1 when the call failed)."""
        return f"{self.options.install_dir}/bin/claw"

    def usage(self) -> str:
        """A short text for a prompt: how an agent with a shell calls the tools (the
        ``claw`` command, or HTTP), and the tools offered."""
        from ._usage import usage_text

        return usage_text(self.claw_command_in_sandbox, self.http_base_in_sandbox, self._tools)

    # ---- the agent's tools, from the driver -------------------------------------------

    def tool_specs(self) -> list[dict[str, Any]]:
        """The tools of the offered services as OpenAI function tools
        (``{"type": "function", "function": {"name", "description", "parameters"}}``), as
        the in-sandbox services list them (fetched at start and at each reset)."""
        return [json.loads(json.dumps(t)) for t in self._tools]

    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self._tools]

    async def call_tool(self, name: str, arguments: str | Mapping[str, Any]) -> str:
        """Run one tool call of the agent against the in-sandbox service and return what the
        model is shown: the JSON of ``{"ok": true, "result": ...}`` or of ``{"ok": false,
        "error": {"code", "message"}}`` (an unknown tool, arguments that are not a JSON
        object or do not fit the schema, an id that is not there: the model's mistakes, told
        to it, and audited). Raises :class:`ServicesLost` when the service is gone."""
        from ._start import call_tool

        return await call_tool(self, name, arguments)

    # ---- the grader's side ------------------------------------------------------------

    async def health(self) -> Health:
        """The services' health (unauthenticated: anyone in the sandbox may ask)."""
        from ._start import health

        return await health(self)

    async def reset(self, fixtures: Fixtures | None = None) -> None:
        """Back to ``fixtures`` (None: the ones of the start): every service's state, the
        files root emptied and refilled, and the audit log emptied; the tool list is
        fetched again (the services offered may change)."""
        from ._start import reset

        await reset(self, fixtures or self.fixtures)

    async def audit(self) -> list[AuditEntry]:
        """Every call the agent made since the last reset, in order (signed by the services;
        :class:`ServicesTampered` if not, :class:`ServicesLost` if they are gone)."""
        from ._start import admin

        answer = await admin(self, "audit", {})
        return [AuditEntry(**entry) for entry in answer["entries"]]

    async def state(self) -> dict[str, Any]:
        """Each offered service's state now, for graders: ``{"mail": {"messages": [...],
        "folders": [...]}, "calendar": {"events": [...]}, "contacts": {...},
        "files": {"files": {path: {"size", "sha256", "text"?}}}, "todo": {"items": [...]},
        "web": {"fetched": [...]}, "tau2": {"db": {...}}}`` (signed like :meth:`audit`)."""
        from ._start import admin

        answer = await admin(self, "state", {})
        return dict(answer["state"])


# ---- the admin channel's secrets (signatures: .box.wire, shared with the sandbox's side) ----


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def new_nonce() -> str:
    return f"{time.time_ns():x}-{secrets.token_hex(12)}"
