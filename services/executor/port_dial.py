"""Dial a TCP port on one sandbox's own loopback, and nowhere else.

Port forwarding (``ConnectPort``, :mod:`ports`) needs a socket that lives in
the sandbox's network namespace, so that ``127.0.0.1`` is the sandbox's
loopback and not the node's. Two cases, behind one small interface
(:class:`PortDialer`):

- :class:`NamespaceDialer` (the node executor, host network namespace): the
  socket is *created* in the sandbox's namespace by a dedicated thread that
  ``setns``\\ es into it, calls ``socket()`` and ``setns``\\ es straight back. A
  socket keeps the namespace it was created in for its whole life, so the
  connect and all the I/O then run on the event loop like any other socket.
  Python 3.11 has no ``os.setns``: ``setns(2)`` is called through ctypes.
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
- steer the namespace through a stale pid: the sandbox's init is opened as a
  ``/proc/<pid>`` directory fd, and the namespace is taken through that fd only
  after checking that the process's root is the sandbox's rootfs (a reused pid
  belongs to another process, whose root differs; an fd of a process that has
  exited opens nothing);
- land in the node's namespace: a namespace equal to the executor's own is
  refused (it would make ``127.0.0.1`` the node's loopback: the gateway, the
  scheduler, every service's control port).

If the dialing thread ever fails to return to the executor's namespace, the
dialer refuses every later call (and says so in the log) rather than create
sockets in the wrong place; the thread is never reused for anything else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import socket
from typing import Any, Protocol

import grpc
import structlog

from orchard.common.errors import ServiceError, infrastructure, invalid, precondition

from .sandboxes import Sandbox

log = structlog.get_logger("orchard.executor.ports")

CLONE_NEWNET = 0x40000000
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


def _new_socket(family: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    return sock


class LocalDialer:
    """The injected executor: this process already lives in the sandbox's namespace."""

    async def dial(
        self, sandbox: Sandbox, family: int, address: tuple[str, int], connect_seconds: float
    ) -> socket.socket:
        sock = _new_socket(family)
        try:
            await connect(sock, address, connect_seconds)
        except BaseException:
            sock.close()
            raise
        return sock


def _libc_setns() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    setns = libc.setns
    setns.argtypes = (ctypes.c_int, ctypes.c_int)
    setns.restype = ctypes.c_int
    return setns


def _ns_inode(path: str, dir_fd: int | None = None) -> tuple[int, int]:
    st = os.stat(path, dir_fd=dir_fd)
    return st.st_dev, st.st_ino


class NamespaceDialer:
    """The node executor: create each socket inside the sandbox's network namespace."""

    def __init__(self) -> None:
        self._setns = _libc_setns()
        self._home_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self._home = _ns_inode("/proc/self/ns/net")
        # One thread, used for nothing else: it is the only one that ever leaves
        # the executor's namespace, and it always comes straight back.
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "orchard-netns")
        self._broken = False

    def close(self) -> None:
        self._thread.shutdown(wait=False)
        with contextlib.suppress(OSError):
            os.close(self._home_fd)

    def sandbox_netns(self, sandbox: Sandbox) -> int:
        """An fd of the sandbox's network namespace, checked to be the sandbox's own."""
        pid = sandbox.meta.init_pid
        if pid <= 1:
            raise precondition(
                f"sandbox {sandbox.sandbox_id} has no init pid on this node", "SANDBOX_NOT_READY"
            )
        try:
            proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            raise _gone(sandbox) from None
        try:
            try:
                netns = os.open("ns/net", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
                root = os.stat("root", dir_fd=proc)
            except OSError:
                raise _gone(sandbox) from None
            try:
                expected = os.stat(sandbox.rootfs)
                if (root.st_dev, root.st_ino) != (expected.st_dev, expected.st_ino):
                    raise _gone(sandbox)
                if _ns_inode(f"/proc/self/fd/{netns}") == self._home:
                    raise precondition(
                        f"sandbox {sandbox.sandbox_id} shares the node's network namespace; "
                        "its ports cannot be forwarded",
                        "SANDBOX_NOT_READY",
                    )
            except BaseException:
                os.close(netns)
                raise
            return netns
        finally:
            os.close(proc)

    def _socket_in(self, netns: int, family: int) -> socket.socket:
        """Runs in the dedicated thread: enter, create, come back."""
        if self._setns(netns, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise infrastructure(f"could not enter the sandbox's network: {os.strerror(err)}")
        try:
            return _new_socket(family)
        finally:
            back = self._setns(self._home_fd, CLONE_NEWNET)
            if back != 0 or _ns_inode("/proc/thread-self/ns/net") != self._home:
                self._broken = True
                log.critical("port dialer thread could not return to the executor's network")

    async def dial(
        self, sandbox: Sandbox, family: int, address: tuple[str, int], connect_seconds: float
    ) -> socket.socket:
        if self._broken:
            raise infrastructure("port forwarding is disabled on this node (see its log)")
        netns = self.sandbox_netns(sandbox)
        try:
            loop = asyncio.get_running_loop()
            sock = await loop.run_in_executor(self._thread, self._socket_in, netns, family)
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
