"""One in-process RPC: the servicer side of a call, run on its own thread.

:class:`RpcRun` plays what grpcio's server does for one call: it takes a
``grpc.RpcMethodHandler`` (exactly the one the generated
``add_*Servicer_to_server`` registers), deserializes the request bytes the
client's stub serialized, runs the handler on a worker thread with a
:class:`CallContext`, and hands serialized responses back through a bounded
queue (so a slow reader slows the servicer, as HTTP/2 flow control does).
The sync and the asyncio channels both sit on it; only the waiting differs.

Statuses follow grpcio: ``context.abort`` ends the call with its code;
any other exception is UNKNOWN ("Exception calling application: ...");
a passed deadline is DEADLINE_EXCEEDED and a client cancel is CANCELLED,
and both fire the context's callbacks (the fake executor kills the command's
process group there, as the real one does when its call ends).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from ._status import Refusal, Trailers

Metadata = tuple[tuple[str, str], ...]
Serializer = Callable[[Any], bytes]
Deserializer = Callable[[bytes], Any]

# Responses queued ahead of the reader before the servicer blocks.
QUEUE_DEPTH = 8
# How often a blocked servicer re-checks whether its call is still alive.
POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Status:
    code: grpc.StatusCode
    details: str
    trailing_metadata: Trailers = ()


OK = Status(grpc.StatusCode.OK, "")


def _nothing() -> None:
    pass


class _Aborted(Exception):
    """Raised by ``CallContext.abort``: unwinds the servicer."""


class CallContext(grpc.ServicerContext):  # type: ignore[misc]
    """What a servicer sees of its call: a ``grpc.ServicerContext`` of an in-process peer."""

    def __init__(self, method: str, metadata: Metadata, deadline: float | None) -> None:
        self.method = method
        self._metadata = metadata
        self._deadline = deadline
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._abandon_callbacks: list[Callable[[], None]] = []
        self._ended = threading.Event()
        self.abandoned = False
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailers: Trailers = ()

    # ---- the servicer's side -------------------------------------------------

    def invocation_metadata(self) -> Metadata:  # type: ignore[override]
        return self._metadata

    def time_remaining(self) -> float | None:  # type: ignore[override]
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def is_active(self) -> bool:
        return not self._ended.is_set()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` when the call ends (done, cancelled or past its deadline)."""
        with self._lock:
            if self._ended.is_set():
                return False
            self._callbacks.append(callback)
            return True

    def on_abandon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` only if the client cancels or the deadline passes
        (what the real executor does with a command whose call went away)."""
        with self._lock:
            if not self._ended.is_set():
                self._abandon_callbacks.append(callback)
                return
        if self.abandoned:
            callback()

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailers = tuple((str(k), str(v)) for k, v in metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        self.code, self.details = code, details
        raise _Aborted(details)

    def abort_with_status(self, status: Any) -> NoReturn:
        self.set_trailing_metadata(tuple(status.trailing_metadata or ()))
        self.abort(status.code, status.details)

    def cancel(self) -> None:
        self.end(abandoned=True)

    def peer(self) -> str:
        return "in-process:orchard.testing"

    def peer_identities(self) -> None:
        return None

    def peer_identity_key(self) -> None:
        return None

    def auth_context(self) -> dict[str, bytes]:
        return {}

    def set_compression(self, compression: Any) -> None:
        pass

    def send_initial_metadata(self, initial_metadata: Any) -> None:
        pass

    def disable_next_message_compression(self) -> None:
        pass

    def refuse(self, refusal: Refusal) -> NoReturn:
        """Abort with a :class:`Refusal`'s code, message and orchard trailers."""
        self.set_trailing_metadata(refusal.trailers())
        self.abort(refusal.code, refusal.message)

    def wait_ended(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if the call ended meanwhile."""
        return self._ended.wait(seconds)

    # ---- the call's side -----------------------------------------------------

    def end(self, abandoned: bool = False) -> None:
        with self._lock:
            if self._ended.is_set():
                return
            self.abandoned = abandoned
            self._ended.set()
            callbacks, self._callbacks = self._callbacks, []
            if abandoned:
                callbacks += self._abandon_callbacks
            self._abandon_callbacks = []
        for callback in callbacks:
            callback()


class _End:
    def __init__(self, status: Status) -> None:
        self.status = status


class RpcRun:
    """One call in flight: its context, its worker thread and its response queue."""

    def __init__(
        self,
        method: str,
        handler: grpc.RpcMethodHandler[Any, Any],
        requests: Iterator[bytes],
        metadata: Metadata,
        timeout: float | None,
    ) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.context = CallContext(method, metadata, self.deadline)
        self._handler = handler
        self._requests = requests
        self._out: queue.Queue[bytes | _End] = queue.Queue(QUEUE_DEPTH)
        # Called (from any thread) whenever there is something new to read.
        self.notify: Callable[[], None] = _nothing
        self._status: Status | None = None
        self._local_end = False
        self._status_lock = threading.Lock()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"fake{method}", daemon=True)
        self._thread.start()

    # ---- worker thread -------------------------------------------------------

    def _request_messages(self) -> Iterator[Any]:
        deserialize = self._handler.request_deserializer
        for raw in self._requests:
            if not self.context.is_active():
                return
            yield deserialize(raw) if deserialize is not None else raw

    def _put(self, item: bytes | _End) -> bool:
        """Queue ``item`` for the reader; False once the client has cancelled or expired."""
        while not self._local_end:
            try:
                self._out.put(item, timeout=POLL_SECONDS)
            except queue.Full:
                continue
            self.notify()
            return True
        return False

    def _serve(self) -> None:
        h = self._handler
        serialize = h.response_serializer or (lambda m: m)
        try:
            if h.request_streaming:
                request: Any = self._request_messages()
            else:
                request = next(self._request_messages(), None)
                if request is None:
                    raise RuntimeError("no request message")
            if h.response_streaming:
                behaviour = h.stream_stream if h.request_streaming else h.unary_stream
                assert behaviour is not None
                for response in behaviour(request, self.context):
                    if not self._put(serialize(response)):
                        break
            else:
                behaviour = h.stream_unary if h.request_streaming else h.unary_unary
                assert behaviour is not None
                self._put(serialize(behaviour(request, self.context)))
            status = OK
        except _Aborted:
            ctx = self.context
            status = Status(ctx.code or grpc.StatusCode.UNKNOWN, ctx.details, ctx.trailers)
        except Exception as exc:
            status = Status(grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}")
        self._settle(status)
        self._put(_End(self._status or status))

    # ---- client side ---------------------------------------------------------

    def _settle(self, status: Status, abandoned: bool = False) -> bool:
        """Fix the call's status once (first writer wins) and end the context."""
        with self._status_lock:
            first = self._status is None
            if first:
                self._status = status
                self._local_end = abandoned
        self.context.end(abandoned and first)
        self._finished.set()
        self.notify()
        return first

    def cancel(self, details: str = "Locally cancelled by application!") -> bool:
        return self._settle(Status(grpc.StatusCode.CANCELLED, details), abandoned=True)

    def expire(self) -> None:
        self._settle(Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), abandoned=True)

    @property
    def status(self) -> Status | None:
        return self._status

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def next_item(self, wait: float | None) -> bytes | Status | None:
        """A serialized response, the final Status, or None if ``wait`` passed first."""
        if self._local_end and self._status is not None:
            return self._status  # cancelled or expired here: nothing more is read
        try:
            item = self._out.get_nowait() if wait == 0 else self._out.get(timeout=wait)
        except queue.Empty:
            return None
        if isinstance(item, _End):
            return self._status or item.status
        return item

    def next_blocking(self) -> bytes | Status:
        """Wait for the next item, honouring the deadline (sync callers)."""
        while True:
            remaining = self.remaining()
            if remaining is not None and remaining <= 0:
                self.expire()
            item = self.next_item(POLL_SECONDS if remaining is None else min(remaining, 0.5))
            if item is not None:
                return item

    def wait_finished(self, seconds: float | None) -> bool:
        return self._finished.wait(seconds)
