"""Starting the services in a sandbox and talking to them (the body of :class:`ClawServices`).

Start, in order (each timed in ``ClawServices.start_seconds``):

``install``   once per sandbox: the runtime's ``site.tar`` (``make claw-services``) and the
              in-sandbox package (fresh from this checkout, every start) written as two
              files and unpacked with the image's ``tar`` under ``install_dir``;
``process``   ``python3 -I <dir>/claw_box/launch.py serve --port N`` as a background
              process; the admin secret written on its stdin, which is then closed;
``health``    a port forward of the SDK to that port, ``GET /health`` until it answers (the
              process's exit, if it dies, is the error);
``reset``     the fixtures loaded over the signed admin channel; the tool list fetched;
``mcp``       with ``ServiceOptions(mcp=True)``: the MCP server, until its port answers.

The driver's requests go over one aiohttp session through the forward; the sandbox's network
policy is untouched (``none`` stays ``none``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import shlex
import tarfile
import time
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp

from orchard import ExecStatus, OrchardError, OutputChunk

from . import runtime as _runtime
from .box.wire import sign_request, sign_response
from .client import (
    Health,
    RuntimeNotBuilt,
    ServicesAdminError,
    ServicesError,
    ServicesLost,
    ServicesStartError,
    ServicesTampered,
    new_nonce,
    new_secret,
)

if TYPE_CHECKING:
    from orchard import AsyncProcess, AsyncSandbox

    from .client import ClawServices, ServiceOptions
    from .fixtures import Fixtures


log = logging.getLogger("orchard.recipes.claw.services")

CLIENT_KEEPALIVE_SECONDS = 5.0
"""How long the driver keeps an idle connection to the services (they close theirs at 15 s)."""

MARKER = ".installed"


def _box_tar() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in _runtime.box_files().items():
            info = tarfile.TarInfo(f"claw_box/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def _exec(sandbox: AsyncSandbox, argv: list[str], what: str, seconds: float = 120) -> str:
    try:
        done = await sandbox.exec(argv, timeout=seconds)
    except OrchardError as err:
        raise ServicesStartError(f"{what}: {type(err).__name__}: {err}") from err
    if done.exit_code != 0:
        raise ServicesStartError(
            f"{what}: exit {done.exit_code}: {(done.stderr_text or done.stdout_text)[-1500:]}"
        )
    return done.stdout_text


async def install(sandbox: AsyncSandbox, options: ServiceOptions) -> None:
    """Put the runtime (if this sandbox has not got it) and the package into the sandbox."""
    found = _runtime.find(options.runtime)
    if found is None:
        where = options.runtime or _runtime.runtime_dir()
        raise RuntimeNotBuilt(
            f"the Claw services' runtime is not built at {where}: run `make claw-services` "
            "(python -m orchard.recipes.claw.services.runtime build)"
        )
    d = options.install_dir
    marker = f"{d}/site/{MARKER}-{_runtime.digest()}"
    probe = await _exec(
        sandbox,
        ["sh", "-c", f'test -e "{marker}" && echo yes || echo no; {options.python} -c '
         '"import sys; print(sys.version_info[0], sys.version_info[1])" || echo none'],
        "probe the sandbox",
    )  # fmt: skip
    have_site, version = [*probe.split("\n", 1), ""][:2]
    parts = version.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ServicesStartError(
            f"the image has no usable {options.python} (the services need Python 3.11): {probe!r}"
        )
    if (int(parts[0]), int(parts[1])) != (3, 11):
        raise ServicesStartError(
            f"{options.python} is Python {parts[0]}.{parts[1]}; the services' runtime is built "
            "for 3.11 (the default image's)"
        )
    try:
        await sandbox.write_file(f"{d}/box.tar", _box_tar())
        if have_site.strip() != "yes":
            await sandbox.write_file(f"{d}/site.tar", found.tarball.read_bytes())
    except OrchardError as err:
        raise ServicesStartError(f"write the services into the sandbox: {err}") from err
    wrapper = (
        f"#!/bin/sh\nexec {options.python} -I {d}/claw_box/launch.py call "
        f'--base http://127.0.0.1:{options.port} "$@"\n'
    )
    script = (
        f'cd "{d}" && rm -rf claw_box && tar -xf box.tar && rm -f box.tar && mkdir -p bin '
        f"&& printf '%s' {shlex.quote(wrapper)} > bin/claw && chmod 755 bin/claw"
    )
    if have_site.strip() != "yes":
        script += f' && rm -rf site && tar -xf site.tar && rm -f site.tar && touch "{marker}"'
    await _exec(sandbox, ["sh", "-c", script], "unpack the services", seconds=300)


async def _process_gone(process: AsyncProcess) -> str | None:
    """None while it runs; else how it ended, with its output's tail."""
    try:
        result = await process.poll()
    except OrchardError as err:
        return f"its state cannot be read: {err}"
    if result is None:
        return None
    how = f"signal {result.signal}" if result.signal else f"exit {result.exit_code}"
    output = (result.stderr_text + result.stdout_text)[-2000:]
    return f"{how}: {output.strip()}"


async def start_services(
    cls: type[ClawServices], sandbox: AsyncSandbox, fixtures: Fixtures, options: ServiceOptions
) -> ClawServices:
    times: dict[str, float] = {}
    began = time.monotonic()
    await install(sandbox, options)
    times["install"] = round(time.monotonic() - began, 4)
    secret = new_secret()
    mark = time.monotonic()
    launch = f"{options.install_dir}/claw_box/launch.py"
    try:
        process = await sandbox.start(
            [options.python, "-I", launch, "serve", "--port", str(options.port)], stdin=True
        )
        await process.write(secret.hex() + "\n")
        await process.close_stdin()
    except OrchardError as err:
        raise ServicesStartError(f"start the services: {err}") from err
    times["process"] = round(time.monotonic() - mark, 4)
    services = cls(sandbox, fixtures, options, secret, process, None)
    try:
        mark = time.monotonic()
        try:
            services._forward = await sandbox.forward_port(options.port)
        except OrchardError as err:
            raise ServicesStartError(f"forward port {options.port}: {err}") from err
        services._http = aiohttp.ClientSession(
            services._forward.url,
            timeout=aiohttp.ClientTimeout(total=options.call_timeout),
            # Well below the services' own idle timeout (IDLE_SECONDS, 15 s; aiohttp's
            # default is also 15 s): a kept-alive connection the services are closing
            # at that moment would be reused and the call reset (seen under load).
            connector=aiohttp.TCPConnector(keepalive_timeout=CLIENT_KEEPALIVE_SECONDS),
        )
        await _wait_listening(process, options.start_timeout, "the services")
        await health(services)
        times["health"] = round(time.monotonic() - mark, 4)
        mark = time.monotonic()
        await reset(services, fixtures)
        times["reset"] = round(time.monotonic() - mark, 4)
        if options.mcp:
            mark = time.monotonic()
            services._mcp_process = await _start_mcp(services)
            times["mcp"] = round(time.monotonic() - mark, 4)
    except BaseException:
        await services.stop()
        raise
    times["total"] = round(time.monotonic() - began, 4)
    services.start_seconds = times
    return services


async def _wait_listening(process: AsyncProcess, seconds: float, what: str) -> None:
    """Until the process prints its ``{"listening": port}`` line (it binds first, so the
    port then takes connections); its exit, with its output, is the error."""
    output = b""
    try:
        async with asyncio.timeout(seconds):
            async for event in process.output():
                if isinstance(event, OutputChunk):
                    output += event.data
                    if event.stream == "stdout" and b'"listening"' in output:
                        return
                elif isinstance(event, ExecStatus):
                    how = f"signal {event.signal}" if event.signal else f"exit {event.exit_code}"
                    raise ServicesStartError(
                        f"{what} exited ({how}) before listening: "
                        f"{output[-2000:].decode('utf-8', 'replace').strip()}"
                    )
    except TimeoutError:
        raise ServicesStartError(
            f"{what} did not listen within {seconds:g} s: "
            f"{output[-2000:].decode('utf-8', 'replace').strip()}"
        ) from None
    except OrchardError as err:
        raise ServicesStartError(f"{what}: its output cannot be read: {err}") from err
    raise ServicesStartError(f"{what}: its output ended before it listened")


async def _start_mcp(services: ClawServices) -> AsyncProcess:
    options, sandbox = services.options, services.sandbox
    argv = [options.python, "-I", f"{options.install_dir}/claw_box/launch.py", "mcp",
            "--base", services.http_base_in_sandbox, "--port", str(options.mcp_port)]  # fmt: skip
    try:
        process = await sandbox.start(argv)
    except OrchardError as err:
        raise ServicesStartError(f"start the MCP server: {err}") from err
    try:
        await _wait_listening(process, options.start_timeout, "the MCP server")
    except BaseException:
        with contextlib.suppress(Exception):
            await process.kill()
        raise
    return process


async def _lost(services: ClawServices, err: BaseException) -> ServicesError:
    gone = await _process_gone(services._process)
    if gone is not None:
        return ServicesLost(f"the services' process is gone ({gone})")
    return ServicesError(f"the services did not answer: {type(err).__name__}: {err}")


async def call_tool(services: ClawServices, name: str, arguments: str | Mapping[str, Any]) -> str:
    body = (
        arguments.encode() if isinstance(arguments, str) else json.dumps(dict(arguments)).encode()
    )
    path = "/v1/tools/" + urllib.parse.quote(str(name), safe="")
    headers = {"Content-Type": "application/json", "X-Claw-Channel": "driver"}
    try:
        async with services._http.post(path, data=body, headers=headers) as answer:
            text = await answer.text()
            status = answer.status
    except (aiohttp.ClientError, TimeoutError) as err:
        raise await _lost(services, err) from err
    try:
        decoded = json.loads(text)
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict) or "ok" not in decoded:
        gone = await _process_gone(services._process)
        if gone is not None:
            raise ServicesLost(f"the services' process is gone ({gone})")
        raise ServicesTampered(f"HTTP {status}: not an answer of the services: {text[:300]!r}")
    return str(text)


RETRIED_ERRORS = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError)
"""A kept-alive connection found reset or closed: an idempotent request goes once more on a
new connection (as RFC 9110 9.2.2 allows; aiohttp does not). Seen under load only (3 test
workers): the services reset a pooled connection between two of the driver's calls, cause
not found; a tool call is never retried (it may have run)."""


async def health(services: ClawServices) -> Health:
    for attempt in (1, 2):
        try:
            async with services._http.get("/health") as answer:
                data = await answer.json(content_type=None)
            break
        except RETRIED_ERRORS as err:
            if attempt == 2 or await _process_gone(services._process) is not None:
                raise await _lost(services, err) from err
            log.warning("claw services: /health on a reset connection, once more: %s", err)
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            raise await _lost(services, err) from err
    return Health(
        ok=bool(data.get("ok")),
        services=list(data.get("services") or []),
        pid=int(data.get("pid") or 0),
        calls=int(data.get("calls") or 0),
        detail={k: v for k, v in data.items() if k not in ("ok", "services", "pid", "calls")},
    )


async def reset(services: ClawServices, fixtures: Fixtures) -> None:
    answer = await admin(services, "reset", {"fixtures": fixtures.wire()})
    services.fixtures = fixtures
    services._tools = list(answer["tools"])


async def admin(services: ClawServices, op: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """One admin call (audit, state, reset: each idempotent, so retried once on a reset
    kept-alive connection, with a fresh nonce)."""
    body = json.dumps(payload).encode()
    async with services._lock:
        for attempt in (1, 2):
            nonce = new_nonce()
            headers = {
                "Content-Type": "application/json",
                "X-Claw-Nonce": nonce,
                "X-Claw-Auth": sign_request(services._secret, op, nonce, body),
            }
            try:
                async with services._http.post(
                    f"/admin/{op}", data=body, headers=headers
                ) as answer:
                    data = await answer.read()
                    signature = answer.headers.get("X-Claw-Signature", "")
                    status = answer.status
                break
            except RETRIED_ERRORS as err:
                if attempt == 2 or await _process_gone(services._process) is not None:
                    raise await _lost(services, err) from err
                log.warning("claw services: %s on a reset connection, once more: %s", op, err)
            except (aiohttp.ClientError, TimeoutError) as err:
                raise await _lost(services, err) from err
    if signature != sign_response(services._secret, nonce, data):
        gone = await _process_gone(services._process)
        raise ServicesTampered(
            f"the answer to {op} is not signed by the services the driver started "
            f"(HTTP {status}; their process: {gone or 'running'}): {data[:300]!r}"
        )
    decoded = json.loads(data)
    if status != 200 or not decoded.get("ok"):
        error = decoded.get("error") or {}
        raise ServicesAdminError(f"{op}: {error.get('code')}: {error.get('message')}")
    return dict(decoded)
