"""The driver side of the browser environment: :class:`BrowserEnv` over one browser sandbox.

A browser sandbox is made from the browser image (``image.py``: Debian's Chromium,
Playwright, MiniWoB++'s HTML) with network ``none`` and a memory cap
(:func:`browser_sandbox_options`). :meth:`BrowserEnv.start` uploads the in-sandbox server
(``server.py``), starts it as a background process (``sb.start``, docs/processes.md) and
waits until it listens; then each :meth:`~BrowserEnv.reset` / :meth:`~BrowserEnv.step` /
:meth:`~BrowserEnv.observe` is one JSON request to it.

Transport: ``"port"`` (default) holds ONE HTTP/1.1 keep-alive connection to the server
through ``sb.connect_port`` (docs/ports.md) for the environment's life; ``"exec"`` runs one
``python3`` client per request inside the sandbox (``sb.exec``). Both are real and measured
(``loadtest/bench_gui.py``, docs/benchmarks.md "GUI browser environment"): a step costs
about the same through either (p50 ~120-130 ms here), because the time goes to the browser
(the action, a screenshot, the element list), not the transport. ``port`` is the default
because it starts no process per step and holds no executor run slot.

Faults: a request the server refuses because the ACTION is wrong raises
:class:`~orchard.recipes.gui.actions.BadAction` (the model's fault; the episode goes on).
Anything that means the browser, the episode's page or the server is gone (connection
closed, HTTP 503 - Chromium disconnected or the page crashed, latched by the server - or
500, the server process exited, a request past its deadline) raises :class:`BrowserCrashed`,
an ``orchard.OrchardError`` with ``fault="infrastructure"``: the rollout must be ABORTED,
not scored as a failed task. After a request that got no answer (deadline, cancellation,
a cut connection) nothing more is sent: the server may still answer it late, and over the
keep-alive connection that answer would pass for the next request's; every later call
raises :class:`BrowserCrashed`. Close the env and start a new browser.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Literal

import orchard
from orchard.rollouts import SandboxOptions

from .actions import Action, BadAction, action_to_dict
from .image import CHROMIUM_IN_IMAGE, MINIWOB_HTML_IN_IMAGE, PYTHONPATH_IN_IMAGE, image_name
from .miniwob import MiniWoBTask

SERVER_PORT = 7800
SERVER_PATH_IN_SANDBOX = "/tmp/orchard-gui/server.py"
DEFAULT_MEMORY = "768Mi"
DEFAULT_PIDS = 512
MAX_RESPONSE_BYTES = 64 << 20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
Transport = Literal["port", "exec"]

# The exec transport's client: stdin = "<path>\n<json body>", stdout = "<status>\n<body>".
_EXEC_CLIENT = """
import http.client, sys
path, _, body = sys.stdin.buffer.read().partition(b"\\n")
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=float(sys.argv[2]))
c.request("POST", path.decode(), body, {"Content-Type": "application/json"})
r = c.getresponse()
sys.stdout.buffer.write(str(r.status).encode() + b"\\n" + r.read())
"""


class BrowserCrashed(orchard.OrchardError):
    """The browser or its server in the sandbox is gone: an infrastructure fault.

    The rollout must be aborted (and retried elsewhere), never scored as a task failure.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="BROWSER_CRASHED", fault="infrastructure")


@dataclass(frozen=True)
class PageTask:
    """A task that is a page to open and an instruction (no ground truth of its own)."""

    url: str
    utterance: str


@dataclass(frozen=True)
class Element:
    """A visible element of the page: ``box`` is ``(x0, y0, x1, y1)`` normalised to the
    viewport (clamped to it), ``text`` its visible text (a control: its label)."""

    tag: str
    text: str
    box: tuple[float, float, float, float]
    id: str = ""
    type: str = ""
    interactive: bool = False
    value: str | None = None
    checked: bool | None = None

    @property
    def center(self) -> tuple[float, float]:
        """The middle of the box, normalised (a place to click)."""
        x0, y0, x1, y1 = self.box
        return ((x0 + x1) / 2, (y0 + y1) / 2)


@dataclass(frozen=True)
class Observation:
    """What the agent (and the grader) sees after a reset or a step.

    ``task_reward`` and ``task_done`` are MiniWoB's own ground truth (its raw reward: > 0 is
    success, -1 a failure or a time-out), None / False for tasks without one and while the
    episode runs. ``action_error`` is set when a well-formed action could not take effect
    in the browser (a navigation that failed); the episode goes on.
    """

    png: bytes
    url: str
    utterance: str
    elements: tuple[Element, ...] = ()
    task_reward: float | None = None
    task_done: bool = False
    task_reason: str | None = None
    axtree: str | None = None
    action_error: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def find(self, text: str, *, tag: str | None = None) -> Element:
        """The first element whose text is ``text`` (and tag ``tag``); KeyError if none."""
        for element in self.elements:
            if element.text == text and (tag is None or element.tag == tag):
                return element
        raise KeyError(f"no element with text {text!r}" + (f" and tag {tag}" if tag else ""))


def browser_sandbox_options(
    *,
    memory: int | str = DEFAULT_MEMORY,
    cpu: float | str | None = 1.0,
    pids: int = DEFAULT_PIDS,
    ttl: float | None = 3600.0,
    labels: Mapping[str, str] | None = None,
) -> SandboxOptions:
    """The sandbox of one browser: the browser image, network ``none``, memory-capped."""
    return SandboxOptions(
        image=image_name(),
        network="none",
        cpu=cpu,
        memory=memory,
        pids=pids,
        ttl=ttl,
        labels=dict(labels or {"orchard.recipe": "gui"}),
        tools_layer=False,
        model_endpoint=False,
    )


async def create_browser_sandbox(
    client: orchard.AsyncOrchard, options: SandboxOptions | None = None
) -> orchard.AsyncSandbox:
    """A sandbox made as ``options`` (default :func:`browser_sandbox_options`) say."""
    o = options or browser_sandbox_options()
    return await client.sandboxes.create(
        image=o.image,
        cpu=o.cpu,
        memory=o.memory,
        network=o.network,
        ttl=o.ttl,
        labels=o.labels,
        env=o.env,
        pids=o.pids,
        timeout=o.create_timeout,
        wait_for_quota=o.wait_for_quota,
    )


def _element(raw: Any) -> Element:
    box = raw["box"]
    if not (isinstance(box, list) and len(box) == 4):
        raise ValueError("element box must be four numbers")
    x0, y0, x1, y1 = (float(v) for v in box)
    if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in (x0, y0, x1, y1)):
        raise ValueError(f"element box {box} is outside 0..1")
    value, checked = raw.get("value"), raw.get("checked")
    return Element(
        tag=str(raw["tag"]),
        text=str(raw["text"]),
        box=(x0, y0, x1, y1),
        id=str(raw.get("id") or ""),
        type=str(raw.get("type") or ""),
        interactive=bool(raw.get("interactive")),
        value=None if value is None else str(value),
        checked=None if checked is None else bool(checked),
    )


def observation_from_json(body: Mapping[str, Any]) -> Observation:
    """The server's observation JSON, checked (the sandbox is hostile too)."""
    try:
        png = base64.b64decode(body["png"], validate=True)
        if not png.startswith(PNG_MAGIC):
            raise ValueError("the screenshot is not a PNG")
        task = body.get("task")
        done, reward, reason = False, None, None
        if task is not None:
            done = bool(task["done"])
            reason = None if task.get("reason") is None else str(task["reason"])
            if done:
                reward = float(task["raw_reward"])
                if not math.isfinite(reward):
                    raise ValueError("task reward is not finite")
        axtree = body.get("axtree")
        error = body.get("action_error")
        return Observation(
            png=png,
            url=str(body["url"]),
            utterance=str(body["utterance"]),
            elements=tuple(_element(e) for e in body["elements"]),
            task_reward=reward,
            task_done=done,
            task_reason=reason,
            axtree=None if axtree is None else str(axtree),
            action_error=None if error is None else str(error),
            raw=body,
        )
    except (KeyError, TypeError, ValueError, binascii.Error) as err:
        raise BrowserCrashed(f"the browser server sent a malformed observation: {err}") from err


class BrowserEnv:
    """One browser in one sandbox. ``await env.start()`` first (or use ``async with``).

    ``owns_sandbox``: :meth:`close` deletes the sandbox too (what :meth:`create` sets).
    ``viewport`` is the page's CSS size, ``scale`` the device pixel ratio of screenshots
    (MiniWoB's task area is 160 x 210 CSS px; 2x gives the model 320 x 420 pixels).
    """

    def __init__(
        self,
        sandbox: orchard.AsyncSandbox,
        *,
        transport: Transport = "port",
        viewport: tuple[int, int] = (160, 210),
        scale: float = 2.0,
        axtree: bool = False,
        port: int = SERVER_PORT,
        start_timeout: float = 60.0,
        request_timeout: float = 60.0,
        owns_sandbox: bool = False,
    ) -> None:
        if transport not in ("port", "exec"):
            raise ValueError(f"transport must be 'port' or 'exec', not {transport!r}")
        self.sandbox = sandbox
        self.transport: Transport = transport
        self.viewport = viewport
        self.scale = scale
        self.axtree = axtree
        self.port = port
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        self.owns_sandbox = owns_sandbox
        self._process: orchard.AsyncProcess | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        # Why the server cannot be trusted any more (a request past its deadline, cancelled
        # or cut off): its late answer would be read as the answer to the next request.
        self._broken: str | None = None

    @classmethod
    async def create(
        cls,
        client: orchard.AsyncOrchard,
        options: SandboxOptions | None = None,
        **kwargs: Any,
    ) -> BrowserEnv:
        """A new browser sandbox with its server started; :meth:`close` deletes it."""
        sandbox = await create_browser_sandbox(client, options)
        env = cls(sandbox, owns_sandbox=True, **kwargs)
        try:
            await env.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await sandbox.delete()
            raise
        return env

    async def __aenter__(self) -> BrowserEnv:
        if self._process is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Upload and start the server; return once it listens (Chromium is up by then)."""
        source = resources.files(__package__).joinpath("server.py").read_bytes()
        await self.sandbox.write_file(SERVER_PATH_IN_SANDBOX, source)
        argv = ["python3", SERVER_PATH_IN_SANDBOX, "--port", str(self.port),
                "--chromium", CHROMIUM_IN_IMAGE, "--miniwob-dir", MINIWOB_HTML_IN_IMAGE]  # fmt: skip
        self._process = await self.sandbox.start(argv, env={"PYTHONPATH": PYTHONPATH_IN_IMAGE})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout
        while True:
            result = await self._process.poll()
            if result is not None:
                raise BrowserCrashed(
                    f"the browser server exited ({result.exit_code}) before it listened: "
                    f"{(result.stderr or result.stdout).decode(errors='replace')[-1500:]}"
                )
            try:
                sock = await self.sandbox.connect_port(self.port)
            except orchard.PortNotListeningError:
                if loop.time() > deadline:
                    raise BrowserCrashed(
                        f"the browser server did not listen within {self.start_timeout:.0f} s"
                    ) from None
                await asyncio.sleep(0.1)
                continue
            if self.transport == "port":
                self._reader, self._writer = await asyncio.open_connection(sock=sock)
            else:
                sock.close()
            return

    async def reset(self, task: MiniWoBTask | PageTask) -> Observation:
        """Open a new episode (a fresh browser context) on ``task``."""
        body: dict[str, Any] = {
            "width": self.viewport[0],
            "height": self.viewport[1],
            "scale": self.scale,
            "axtree": self.axtree,
        }
        if isinstance(task, MiniWoBTask):
            body |= {"miniwob": task.name, "url": None, "seed": task.seed,
                     "episode_seconds": task.episode_seconds}  # fmt: skip
        else:
            body |= {"miniwob": None, "url": task.url, "utterance": task.utterance}
        return observation_from_json(await self._request("/reset", body))

    async def step(self, action: Action) -> Observation:
        """Perform ``action`` and observe the page after it."""
        return observation_from_json(await self._request("/step", action_to_dict(action)))

    async def observe(self) -> Observation:
        """The page now, without acting."""
        return observation_from_json(await self._request("/observe", {}))

    async def screenshot(self) -> bytes:
        """A PNG of the viewport now."""
        return (await self.observe()).png

    async def server_pid(self) -> int | None:
        """The server's pid inside the sandbox (tests kill its Chromium by it)."""
        if self._process is None:
            return None
        return (await self._process.info()).pid

    async def close(self) -> None:
        """Stop the server (and delete the sandbox if this env owns it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._process is not None:
                with contextlib.suppress(
                    BrowserCrashed, orchard.OrchardError, OSError, TimeoutError
                ):
                    await asyncio.wait_for(self._request("/close", {}), 10)
                with contextlib.suppress(orchard.OrchardError):
                    await self._process.kill()
        finally:
            if self._writer is not None:
                self._writer.close()
            if self.owns_sandbox:
                with contextlib.suppress(orchard.SandboxNotFoundError):
                    await self.sandbox.delete()

    # ---- transport -------------------------------------------------------------

    async def _request(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        if self._process is None:
            raise RuntimeError("BrowserEnv.start() was not called")
        data = json.dumps(body).encode()
        async with self._lock:
            if self._broken is not None:
                raise BrowserCrashed(
                    f"{path}: not sent, the browser server is unusable: {self._broken}"
                )
            answered = False
            try:
                if self.transport == "port":
                    status, payload = await asyncio.wait_for(
                        self._port_request(path, data), self.request_timeout
                    )
                else:
                    status, payload = await self._exec_request(path, data)
                answered = True
            except TimeoutError:
                raise BrowserCrashed(self._break(
                    f"{path}: no answer from the browser server in {self.request_timeout:.0f} s"
                )) from None  # fmt: skip
            except (OSError, EOFError, asyncio.IncompleteReadError, ValueError) as err:
                raise BrowserCrashed(
                    self._break(f"{path}: the browser server connection failed: {err}")
                ) from err
            finally:
                if not answered:  # cancelled mid-request: its answer may still come
                    self._break(f"{path}: the request was cut off before its answer")
        try:
            answer = json.loads(payload)
        except ValueError:
            raise BrowserCrashed(f"{path}: the browser server sent non-JSON ({status})") from None
        if not isinstance(answer, dict):
            raise BrowserCrashed(f"{path}: the browser server sent {type(answer).__name__}")
        if status == 400 and answer.get("error") == "bad_action":
            raise BadAction(str(answer.get("message", "the browser refused the action")))
        if status != 200:
            raise BrowserCrashed(
                f"{path}: HTTP {status} {answer.get('error')}: {answer.get('message')}"
            )
        return answer

    def _break(self, reason: str) -> str:
        """Latch the first transport failure and drop the connection; returns ``reason``.

        A request that got no answer may still be running in the server (a slow page, a
        script in an endless loop): over the keep-alive connection its late answer would be
        read as the answer to the next request, so no request is sent after it.
        """
        if self._broken is None:
            self._broken = reason
        if self._writer is not None:
            self._writer.close()
        return reason

    async def _port_request(self, path: str, data: bytes) -> tuple[int, bytes]:
        reader, writer = self._reader, self._writer
        if reader is None or writer is None or writer.is_closing():
            raise ConnectionError("the connection to the browser server is closed")
        head = (f"POST {path} HTTP/1.1\r\nHost: browser\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n")  # fmt: skip
        writer.write(head.encode() + data)
        await writer.drain()
        status_line = await reader.readuntil(b"\r\n")
        parts = status_line.split()
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ValueError(f"bad status line {status_line[:80]!r}")
        status = int(parts[1])
        length = None
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if length is None or not 0 <= length <= MAX_RESPONSE_BYTES:
            raise ValueError(f"bad Content-Length {length}")
        return status, await reader.readexactly(length)

    async def _exec_request(self, path: str, data: bytes) -> tuple[int, bytes]:
        result = await self.sandbox.exec(
            ["python3", "-c", _EXEC_CLIENT, str(self.port), str(self.request_timeout)],
            stdin=path.encode() + b"\n" + data,
            timeout=self.request_timeout + 5,
            max_output_bytes=MAX_RESPONSE_BYTES,
        )
        if result.exit_code != 0:
            raise ConnectionError(
                f"exec client exited {result.exit_code}: {result.stderr.decode(errors='replace')[-500:]}"
            )
        status, _, payload = result.stdout.partition(b"\n")
        return int(status), payload


__all__ = [
    "BrowserCrashed",
    "BrowserEnv",
    "Element",
    "Observation",
    "PageTask",
    "browser_sandbox_options",
    "create_browser_sandbox",
    "observation_from_json",
]
