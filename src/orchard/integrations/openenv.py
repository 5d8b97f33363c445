"""``OrchardProvider``: an OpenEnv ``ContainerProvider`` whose containers are Orchard sandboxes.

OpenEnv's environment clients (``EnvClient`` and its subclasses, ``GenericEnvClient``)
reach an environment server over HTTP and a WebSocket (``/health``, ``/reset``,
``/step``, ``/state``, ``/ws``) at a base URL; a ``ContainerProvider``
(``openenv/core/containers/runtime/providers.py``) runs that server somewhere and
returns the URL. ``EnvClient.from_docker_image(image, provider=OrchardProvider(...))``
calls ``start_container``, then ``wait_for_ready``, and the client's ``close()`` calls
``stop_container``.

Here the server runs as a background process (``sb.start``) in a sandbox with network
policy ``none``: nothing is opened or published. The base URL is the SDK's port
forwarding (``sb.forward_port(port).url``), a listener on this machine's loopback
relaying over the data plane to ``port`` on the sandbox's loopback.

Differences from OpenEnv's Docker provider, and why:

- an Orchard sandbox has no image entrypoint, so the provider is given the server's
  ``command`` (an OpenEnv image's ``CMD``, e.g. ``uvicorn server.app:app --port 8000``);
- ``port`` is where that server listens *inside* the sandbox (default 8000, the port
  OpenEnv's images serve on); the local port is a free one, in the returned URL;
- options ``start_container`` does not know are refused with ``ValueError``, not
  passed on (there is no ``docker run`` to pass them to).

Errors follow the ``ContainerProvider`` contract: anything Orchard refuses or fails
while starting is ``RuntimeError`` (the sandbox is deleted first); ``wait_for_ready``
raises ``TimeoutError`` when ``/health`` does not answer 200 in time and
``RuntimeError`` (with the server's output) when the server process exited.
"""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from openenv.core.containers.runtime.providers import ContainerProvider

import orchard

DEFAULT_PORT = 8000  # OpenEnv's images serve on 8000 (their Dockerfiles' CMD)
_POLL_S = 0.2
_OUTPUT_TAIL = 4000  # characters of a dead server's output quoted in the error


class OrchardProvider(ContainerProvider):
    """OpenEnv's ``ContainerProvider`` on Orchard (see the module docstring).

    One provider manages one running server at a time, as OpenEnv's own providers do.
    """

    def __init__(
        self,
        command: str | Sequence[str],
        *,
        client: orchard.Orchard | None = None,
        cwd: str | None = None,
        files: Mapping[str, bytes | str] | None = None,
        cpu: float | str | None = None,
        memory: int | str | None = None,
        ttl: float | None = None,
        labels: Mapping[str, str] | None = None,
        create_timeout: float = 120.0,
    ) -> None:
        """``command`` starts the environment server (a shell string or argv);
        ``files`` are written into the sandbox before it starts (path -> content);
        the rest are :meth:`orchard.Orchard.sandboxes.create`'s arguments. Without
        ``client`` one is made from ``ORCHARD_*`` and closed by :meth:`stop_container`."""
        if not command:
            raise ValueError("command: the environment server's command is required")
        self._command = command
        self._cwd = cwd
        self._create: dict[str, Any] = {
            "files": dict(files) if files else None,
            "cpu": cpu,
            "memory": memory,
            "ttl": ttl,
            "labels": dict(labels) if labels else None,
            "timeout": create_timeout,
        }
        self._client = client
        self._owns_client = client is None
        self._sandbox: orchard.Sandbox | None = None
        self._server: orchard.Process | None = None
        self._forward: orchard.PortForward | None = None

    @property
    def sandbox(self) -> orchard.Sandbox | None:
        """The sandbox the server runs in (None when nothing is started)."""
        return self._sandbox

    def start_container(
        self,
        image: str,
        port: int | None = None,
        env_vars: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Create a sandbox of ``image`` (network ``none``), start the server in it with
        ``env_vars`` and return ``http://127.0.0.1:N`` relayed to ``port`` inside."""
        if kwargs:
            raise ValueError(
                f"options OrchardProvider.start_container does not know: {sorted(kwargs)} "
                "(sandbox options are the provider's constructor arguments)"
            )
        if self._sandbox is not None:
            raise RuntimeError(
                f"this provider already runs sandbox {self._sandbox.id}: stop_container first"
            )
        port = DEFAULT_PORT if port is None else port
        if not 0 < port < 65536:
            raise ValueError(f"port {port}: not a TCP port")
        if self._client is None:
            self._client = orchard.Orchard()
        try:
            self._sandbox = self._client.sandboxes.create(
                image=image,
                network="none",
                env=env_vars or None,
                request_id=uuid.uuid4().hex,
                **self._create,
            )
        except orchard.OrchardError as exc:
            raise RuntimeError(f"Orchard could not create a sandbox of {image}: {exc}") from exc
        try:
            self._server = self._sandbox.start(self._command, cwd=self._cwd, env=env_vars)
            self._forward = self._sandbox.forward_port(port)
        except orchard.OrchardError as exc:
            sandbox_id = self._sandbox.id
            self.stop_container()
            raise RuntimeError(
                f"could not start the environment server in sandbox {sandbox_id}: {exc}"
            ) from exc
        return self._forward.url

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        """Poll ``base_url``/health until it answers 200 (``TimeoutError`` after
        ``timeout_s``); ``RuntimeError`` with its output if the server exited."""
        deadline = time.monotonic() + timeout_s
        health = f"{base_url.rstrip('/')}/health"
        last = "no answer yet"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
        while True:
            self._raise_if_server_exited()
            try:
                with opener.open(health, timeout=1.0) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (OSError, ValueError) as exc:  # refused/reset while it starts
                last = str(exc)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{health} not ready after {timeout_s:g}s: {last}")
            time.sleep(_POLL_S)

    def stop_container(self) -> None:
        """Close the forward and delete the sandbox (the server goes with it); a no-op
        when nothing runs. Closes the client if the provider made it."""
        forward, self._forward = self._forward, None
        sandbox, self._sandbox = self._sandbox, None
        self._server = None
        try:
            if forward is not None:
                forward.close()
            if sandbox is not None:
                with contextlib.suppress(orchard.SandboxNotFoundError):
                    sandbox.delete()
        except orchard.OrchardError as exc:
            what = f"sandbox {sandbox.id}" if sandbox is not None else "the port forward"
            raise RuntimeError(f"could not stop {what}: {exc}") from exc
        finally:
            if self._owns_client and self._client is not None:
                client, self._client = self._client, None
                client.close()

    def _raise_if_server_exited(self) -> None:
        server = self._server
        if server is None:
            raise RuntimeError("no environment server is running: start_container first")
        try:
            result = server.poll()
        except orchard.OrchardError as exc:
            raise RuntimeError(f"Orchard sandbox unavailable: {exc}") from exc
        if result is not None:
            output = (result.stdout_text + result.stderr_text)[-_OUTPUT_TAIL:]
            raise RuntimeError(
                f"the environment server exited ({result.status}) before it was ready:\n{output}"
            )
