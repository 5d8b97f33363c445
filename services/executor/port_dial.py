"""Dial a TCP port on one sandbox's own loopback, and nowhere else.

Port forwarding (``ConnectPort``, :mod:`ports`) needs a socket that lives in
the sandbox's network namespace, so that ``127.0.0.1`` is the sandbox's
loopback and not the node's. Two cases, behind one small interface
(:class:`PortDialer`):

- :class:`NamespaceDialer` (the node executor, host network namespace): the
  socket is *created* in the sandbox's namespace (``orchard.common.netns``: a
  dedicated thread ``setns``\\ es in, calls ``socket()`` and comes straight
  back); the connect and all the I/O then run on the event loop.
- :class:`LocalDialer` (the injected executor, inside the sandbox it serves:
  local runc ``injected``, runsc, Kubernetes pods): its own namespace *is* the
  sandbox's, so a plain socket.

Why not let orchard-init connect and pass the fd back (SCM_RIGHTS)? It would
cost a fork of a shim and a Unix-socket round trip per connection and a new
request kind in the C init, for the one case (node mode) where the executor
can enter the namespace itself in microseconds; the injected runtimes need
neither. Under runsc a host-side ``setns`` would not even reach the sandbox
(gVisor's netstack is in the Sentry), which is why that runtime is injected.

What a hostile caller cannot do here:

- name an address: the target is the sandbox's loopback only (``127.0.0.1`` or
  ``::1``; :func:`check_target`), so neither the node, nor its bridge, nor
  another sandbox can be dialled, whatever the sandbox's network policy;
- steer the namespace through a stale pid, or into the node's own namespace
  (which would make ``127.0.0.1`` the node's loopback): ``orchard.common.netns``
  checks the init's root and refuses the executor's own namespace; a thread
  that could not return disables the dialer for good.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Protocol

import grpc

from orchard.common.errors import ServiceError, infrastructure, invalid, precondition
from orchard.common.netns import NetnsBroken, NetnsGone, NetnsSockets, SharesNodeNetns, new_socket

from .sandboxes import Sandbox

LOOPBACK_HOSTS = {"": ("127.0.0.1", socket.AF_INET), "127.0.0.1": ("127.0.0.1", socket.AF_INET)}
LOOPBACK_HOSTS["::1"] = ("::1", socket.AF_INET6)
MAX_PORT = 65535


def check_target(host: str, port: int) -> tuple[int, tuple[str, int]]:
    """(address family, address) of the sandbox-loopback target, or INVALID_ARGUMENT."""
    if not 1 <= port <= MAX_PORT:
        raise invalid(f"port must be 1..{MAX_PORT}, got {port}")
    found = LOOPBACK_HOSTS.get(host)
    if found is None:
        raise invalid(
            f"host {host[:80]!r} is not the sandbox's loopback: only '127.0.0.1' (or '') "
            "and '::1' can be reached through a port forward"
        )
    address, family = found
    return family, (address, port)


class PortDialer(Protocol):
    """Makes a connected socket to ``address`` on the sandbox's own loopback."""

    async def dial(
        self, sandbox: Sandbox, family: int, address: tuple[str, int], connect_seconds: float
    ) -> socket.socket: ...


def shown(address: tuple[str, int]) -> str:
    """``127.0.0.1:8000`` / ``[::1]:8000``."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def connect(sock: socket.socket, address: tuple[str, int], connect_seconds: float) -> None:
    """Non-blocking connect on the loop; refused/timeout become clear statuses."""
    loop = asyncio.get_running_loop()
    where = shown(address)
    try:
        async with asyncio.timeout(connect_seconds):
            await loop.sock_connect(sock, address)
    except ConnectionRefusedError:
        raise precondition(
            f"nothing listens on {where} inside the sandbox (connection refused)",
            "PORT_NOT_LISTENING",
        ) from None
    except TimeoutError:
        raise ServiceError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            "PORT_NOT_LISTENING",
            f"{where} inside the sandbox did not accept within {connect_seconds:g}s",
        ) from None
    except OSError as exc:
        raise precondition(
            f"could not connect to {where} inside the sandbox: {exc.strerror}",
            "PORT_NOT_LISTENING",
        ) from None


class LocalDialer:
    """The injected executor: this process already lives in the sandbox's namespace."""

    async def dial(
        self, sandbox: Sandbox, family: int, address: tuple[str, int], connect_seconds: float
    ) -> socket.socket:
        sock = new_socket(family)
        try:
            await connect(sock, address, connect_seconds)
        except BaseException:
            sock.close()
            raise
        return sock


class NamespaceDialer:
    """The node executor: create each socket inside the sandbox's network namespace."""

    def __init__(self) -> None:
        self._sockets = NetnsSockets()
        self._thread = self._sockets.thread

    def close(self) -> None:
        self._sockets.close()

    def sandbox_netns(self, sandbox: Sandbox) -> int:
        """An fd of the sandbox's network namespace, checked to be the sandbox's own."""
        if sandbox.meta.init_pid <= 1:
            raise precondition(
                f"sandbox {sandbox.sandbox_id} has no init pid on this node", "SANDBOX_NOT_READY"
            )
        try:
            return self._sockets.open_netns(sandbox.meta.init_pid, sandbox.rootfs)
        except NetnsGone:
            raise _gone(sandbox) from None
        except SharesNodeNetns:
            raise precondition(
                f"sandbox {sandbox.sandbox_id} shares the node's network namespace; "
                "its ports cannot be forwarded",
                "SANDBOX_NOT_READY",
            ) from None

    async def dial(
        self, sandbox: Sandbox, family: int, address: tuple[str, int], connect_seconds: float
    ) -> socket.socket:
        if self._sockets.broken:
            raise infrastructure("port forwarding is disabled on this node (see its log)")
        netns = self.sandbox_netns(sandbox)
        try:
            sock = await self._sockets.socket_in(netns, family)
        except NetnsBroken as err:
            raise infrastructure(str(err)) from None
        finally:
            os.close(netns)
        try:
            await connect(sock, address, connect_seconds)
        except BaseException:
            sock.close()
            raise
        return sock


def _gone(sandbox: Sandbox) -> ServiceError:
    return precondition(
        f"sandbox {sandbox.sandbox_id}'s init is not running (stopped or being deleted)",
        "SANDBOX_NOT_READY",
    )
