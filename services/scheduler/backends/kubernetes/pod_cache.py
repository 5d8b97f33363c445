"""PodCache: every sandbox pod, kept current by one list + watch.

The scheduler reads pods from here (claims, addresses, readiness) instead of
asking the API server on every call. One thread runs the loop:

    list (remember resourceVersion) -> watch from it -> on timeout, watch again
    from the last resourceVersion seen -> on 410 Gone (history compacted),
    list again and replace the cache (pods deleted meanwhile drop out)

Events are applied on the asyncio loop (``call_soon_threadsafe``), so readers
never see a half-applied change and waiters wake on the loop they wait on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import structlog

from ..base import BackendError
from .api import Gone, KubeApi, KubeApiError

log = structlog.get_logger("orchard.scheduler.kubernetes")

Pod = dict[str, Any]


def _rv(pod: Pod) -> int:
    try:
        return int((pod.get("metadata") or {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


class PodCache:
    def __init__(self, api: KubeApi, label_selector: str) -> None:
        self._api = api
        self._selector = label_selector
        self._pods: dict[str, Pod] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._resp: Any = None
        self._changed: asyncio.Condition | None = None
        self.resource_version = ""
        self.relists = 0
        """Lists after the first (each 410 Gone costs one)."""
        self.watch_restarts = 0

    # ---- life -------------------------------------------------------------------

    async def start(self) -> None:
        """List once (so the cache is complete when this returns), then watch in a thread."""
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Condition()
        pods, rv = await self._api.list_pods(self._selector)
        self._replace(pods, rv)
        self._thread = threading.Thread(target=self._run, name="orchard-pod-watch", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)

    # ---- reads --------------------------------------------------------------------

    def get(self, name: str) -> Pod | None:
        return self._pods.get(name)

    def pods(self) -> list[Pod]:
        return list(self._pods.values())

    def observe(self, pod: Pod) -> None:
        """Put an object the backend just got from the API (newer wins)."""
        self._put(pod)

    def forget(self, name: str) -> None:
        self._pods.pop(name, None)
        self._notify()

    async def wait_for(self, predicate: Callable[[], bool], within: float) -> bool:
        """Wait until ``predicate()`` holds (checked after every change) or ``within`` seconds pass."""
        assert self._changed is not None, "PodCache.start() first"
        cond = self._changed
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(predicate), within)
            except TimeoutError:
                return predicate()
        return True

    # ---- applying changes (on the loop) --------------------------------------------

    def _put(self, pod: Pod) -> None:
        name = (pod.get("metadata") or {}).get("name", "")
        current = self._pods.get(name)
        if current is None or _rv(pod) >= _rv(current):
            self._pods[name] = pod
        self._notify()

    def _remove(self, pod: Pod) -> None:
        name = (pod.get("metadata") or {}).get("name", "")
        current = self._pods.get(name)
        if current is not None and _rv(pod) >= _rv(current):
            del self._pods[name]
        self._notify()

    def _replace(self, pods: list[Pod], rv: str) -> None:
        self._pods = {(p.get("metadata") or {}).get("name", ""): p for p in pods}
        self.resource_version = rv
        self._notify()

    def _apply(self, kind: str, obj: Pod) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self._put(obj)
        elif kind == "DELETED":
            self._remove(obj)

    def _notify(self) -> None:
        cond = self._changed
        if cond is None:
            return

        async def wake() -> None:
            async with cond:
                cond.notify_all()

        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.create_task(wake())

    # ---- the watch thread ---------------------------------------------------------

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop closed while we were posting
            loop.call_soon_threadsafe(fn, *args)

    def _set_resp(self, resp: Any) -> None:
        self._resp = resp
        if self._stop.is_set():
            with contextlib.suppress(Exception):
                resp.shutdown()

    def _run(self) -> None:
        rv = self.resource_version
        backoff = 0.2
        while not self._stop.is_set():
            try:
                for event in self._api.watch_pods(self._selector, rv, self._set_resp):
                    obj = event.get("object") or {}
                    new_rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                    if new_rv:
                        rv = new_rv
                    if event.get("type") != "BOOKMARK":
                        self._post(self._apply, str(event.get("type")), obj)
                    self._post(setattr, self, "resource_version", rv)
                backoff = 0.2
                self.watch_restarts += 1
            except Gone:
                if self._stop.is_set():
                    break
                log.info("pod watch expired (410 Gone); relisting", resource_version=rv)
                try:
                    pods, rv = self._api.list_pods_sync(self._selector)
                except (BackendError, KubeApiError) as exc:
                    log.warning("relist failed", error=str(exc))
                    self._stop.wait(backoff)
                    continue
                self.relists += 1
                self._post(self._replace, pods, rv)
            except Exception as exc:  # the watch must outlive any one bad connection
                if self._stop.is_set():
                    break
                log.warning("pod watch failed; retrying", error=str(exc)[:300])
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                self._resp = None
