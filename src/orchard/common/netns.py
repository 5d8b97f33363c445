"""Sockets made inside a sandbox's network namespace, from a process on the node.

A socket keeps the network namespace it was created in for its whole life, so
to have one on a sandbox's loopback a node process needs only to *create* it
there: a dedicated thread ``setns``\\ es into the sandbox's namespace, calls
``socket()`` and ``setns``\\ es straight back; binding, connecting, listening
and all the I/O then run on the event loop like any other socket. Python 3.11
has no ``os.setns``: ``setns(2)`` is called through ctypes. Two users: the node
executor's port forwarding (it *connects* the socket, ``executor.port_dial``)
and the local backend's model endpoint (it *listens* on it,
``scheduler.backends.local.model_endpoint``); both are node processes that the
services-are-independent rule keeps apart, hence this shared module.

What a caller cannot be steered into:

- a stale pid: the sandbox's init is opened as a ``/proc/<pid>`` directory fd,
  and the namespace is taken through that fd only after checking that the
  process's root is the sandbox's rootfs (a reused pid belongs to another
  process, whose root differs; an fd of a process that has exited opens
  nothing): :class:`NetnsGone`;
- the node's own namespace: one equal to this process's is refused (it would
  make ``127.0.0.1`` the node's loopback: every service's control port):
  :class:`SharesNodeNetns`.

If the thread ever fails to return to the process's namespace, every later call
is refused (:class:`NetnsBroken`, and a critical log line) rather than create
sockets in the wrong place; the thread is never used for anything else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import socket
from pathlib import Path
from typing import Any

import structlog

CLONE_NEWNET = 0x40000000

log = structlog.get_logger("orchard.netns")


class NetnsGone(Exception):
    """The sandbox's init is not running (stopped, being deleted, or the pid was reused)."""


class SharesNodeNetns(Exception):
    """The process named lives in the node's own network namespace."""


class NetnsBroken(Exception):
    """The namespace could not be entered, or the thread could not come back (then for good)."""


def _libc_setns() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    setns = libc.setns
    setns.argtypes = (ctypes.c_int, ctypes.c_int)
    setns.restype = ctypes.c_int
    return setns


def _ns_inode(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def new_socket(family: int, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A non-blocking close-on-exec socket (in the calling thread's namespace)."""
    sock = socket.socket(family, kind | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    return sock


class NetnsSockets:
    """Creates sockets in other processes' network namespaces, one dedicated thread."""

    def __init__(self) -> None:
        self._setns = _libc_setns()
        self._home_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self._home = _ns_inode("/proc/self/ns/net")
        # One thread, used for nothing else: it is the only one that ever leaves
        # the process's namespace, and it always comes straight back.
        self.thread = concurrent.futures.ThreadPoolExecutor(1, "orchard-netns")
        self.broken = False

    def close(self) -> None:
        self.thread.shutdown(wait=False)
        with contextlib.suppress(OSError):
            os.close(self._home_fd)

    def open_netns(self, pid: int, rootfs: Path) -> int:
        """An fd of ``pid``'s network namespace, checked to be the sandbox's own
        (``rootfs`` is its root as this process sees it). The caller closes it."""
        if pid <= 1:
            raise NetnsGone(f"no init pid ({pid})")
        try:
            proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            raise NetnsGone(f"process {pid} is gone") from None
        try:
            try:
                netns = os.open("ns/net", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
                root = os.stat("root", dir_fd=proc)
            except OSError:
                raise NetnsGone(f"process {pid} is gone") from None
            try:
                expected = os.stat(rootfs)
                if (root.st_dev, root.st_ino) != (expected.st_dev, expected.st_ino):
                    raise NetnsGone(f"process {pid}'s root is not {rootfs}")
                if _ns_inode(f"/proc/self/fd/{netns}") == self._home:
                    raise SharesNodeNetns(f"process {pid} shares the node's network namespace")
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
            raise NetnsBroken(f"could not enter the sandbox's network: {os.strerror(err)}")
        try:
            return new_socket(family)
        finally:
            back = self._setns(self._home_fd, CLONE_NEWNET)
            if back != 0 or _ns_inode("/proc/thread-self/ns/net") != self._home:
                self.broken = True
                log.critical("the netns thread could not return to the process's network")

    async def socket_in(self, netns: int, family: int = socket.AF_INET) -> socket.socket:
        """A new non-blocking TCP socket inside the namespace ``netns`` (an fd)."""
        if self.broken:
            raise NetnsBroken("sockets in sandboxes are disabled on this node (see its log)")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.thread, self._socket_in, netns, family)

    async def socket_for(
        self, pid: int, rootfs: Path, family: int = socket.AF_INET
    ) -> socket.socket:
        """:meth:`open_netns` then :meth:`socket_in`, the namespace fd closed after."""
        netns = self.open_netns(pid, rootfs)
        try:
            return await self.socket_in(netns, family)
        finally:
            os.close(netns)
