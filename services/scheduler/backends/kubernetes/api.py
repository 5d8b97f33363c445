"""A thin, typed face over the ``kubernetes`` client: dicts in, dicts out, one error tree.

Why a wrapper: the generated client returns model objects (slow to build, and
the backend only reads a few fields), raises ``ApiException`` for every status,
and retries nothing. Here every call returns the raw JSON as dicts, 429 and 5xx
answers are retried with the server's ``Retry-After`` (bounded), and the answers
the backend acts on become their own exceptions (``NotFound``, ``Conflict``,
``Gone``); anything else becomes ``BackendError`` at this edge, so no
``ApiException`` or urllib3 error leaks upward.

The client is synchronous; calls run in worker threads (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from ..base import BackendError
from .settings import KubernetesSettings

T = TypeVar("T")
MERGE_PATCH = "application/merge-patch+json"


class KubeApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class NotFound(KubeApiError):
    pass


class Conflict(KubeApiError):
    """409: AlreadyExists on create, or a stale resourceVersion on update/patch."""

    @property
    def already_exists(self) -> bool:
        return "AlreadyExists" in self.message or "already exists" in self.message


class Gone(KubeApiError):
    """410: the resourceVersion a watch asked for was compacted away; relist."""


def _message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or b"{}")
        return f"{body.get('reason', '')}: {body.get('message', '')}"
    except (ValueError, AttributeError):
        return str(exc.reason)


def _retry_after(exc: ApiException, cap: float) -> float:
    headers = exc.headers or {}
    raw = headers.get("Retry-After") or headers.get("retry-after") or "1"
    try:
        return min(max(float(raw), 0.0), cap)
    except ValueError:
        return min(1.0, cap)


def _classify(exc: ApiException) -> Exception:
    status = int(exc.status or 0)
    msg = _message(exc)
    if status == 404:
        return NotFound(status, msg)
    if status == 409:
        return Conflict(status, msg)
    if status == 410:
        return Gone(status, msg)
    if status == 422:
        return BackendError.invalid(f"the Kubernetes API refused the object: {msg}")
    if status in (401, 403):
        return BackendError.failure(
            f"the Kubernetes API refused access ({status}): {msg}; check RBAC"
        )
    return BackendError.failure(f"Kubernetes API error {status}: {msg}")


def build_api_client(settings: KubernetesSettings) -> k8s.ApiClient:
    """An API client from settings: explicit host, in-cluster config, or a kubeconfig."""
    from kubernetes import config as k8s_config

    if settings.api_host:
        cfg = k8s.Configuration()
        cfg.host = settings.api_host
        return k8s.ApiClient(cfg)
    try:
        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        return k8s.ApiClient()
    except k8s_config.ConfigException:
        pass
    try:
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
            client_configuration=cfg,
        )
    except (k8s_config.ConfigException, OSError) as exc:
        raise BackendError.failure(f"no Kubernetes configuration: {exc}") from None
    return k8s.ApiClient(cfg)


class KubeApi:
    """Pod, NetworkPolicy and Secret calls in one namespace."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        settings: KubernetesSettings,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.namespace = settings.namespace
        self.core = k8s.CoreV1Api(api_client)
        self.net = k8s.NetworkingV1Api(api_client)
        self._sleep = sleep
        self.retries = 0
        """How many 429/5xx answers were retried (visible to tests and metrics)."""

    # ---- plumbing -------------------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn`` with raw JSON out, retrying 429/5xx; raises the typed errors above."""
        kwargs.setdefault("_preload_content", False)
        kwargs.setdefault("_request_timeout", self.settings.request_timeout_seconds)
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = fn(*args, **kwargs)
            except ApiException as exc:
                status = int(exc.status or 0)
                retryable = status == 429 or status >= 500
                if retryable and attempt < self.settings.max_retries:
                    self.retries += 1
                    self._sleep(_retry_after(exc, self.settings.max_retry_after_seconds))
                    continue
                raise _classify(exc) from None
            except urllib3.exceptions.HTTPError as exc:
                if attempt < self.settings.max_retries:
                    self.retries += 1
                    self._sleep(min(0.2 * 2**attempt, self.settings.max_retry_after_seconds))
                    continue
                raise BackendError.failure(f"the Kubernetes API is unreachable: {exc}") from None
            data = resp.data
            return json.loads(data) if data else {}

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._call, fn, *args, **kwargs)

    # ---- pods -------------------------------------------------------------------

    async def list_pods(self, label_selector: str) -> tuple[list[dict[str, Any]], str]:
        """Every matching pod and the list's resourceVersion (where a watch resumes)."""
        return await asyncio.to_thread(self.list_pods_sync, label_selector)

    def list_pods_sync(self, label_selector: str) -> tuple[list[dict[str, Any]], str]:
        body = self._call(
            self.core.list_namespaced_pod, self.namespace, label_selector=label_selector
        )
        items = body.get("items") or []
        return list(items), str((body.get("metadata") or {}).get("resourceVersion", ""))

    async def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._run(
            self.core.create_namespaced_pod, self.namespace, manifest
        )
        return result

    async def get_pod(self, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._run(
                self.core.read_namespaced_pod, name, self.namespace
            )
        except NotFound:
            return None
        return result

    async def patch_pod(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch; a ``metadata.resourceVersion`` in it makes it conditional (409)."""
        result: dict[str, Any] = await self._run(
            self.core.patch_namespaced_pod,
            name,
            self.namespace,
            patch,
            _content_type=MERGE_PATCH,
        )
        return result

    async def delete_pod(self, name: str) -> bool:
        """Delete at once; False when the pod was already gone."""
        try:
            await self._run(
                self.core.delete_namespaced_pod,
                name,
                self.namespace,
                grace_period_seconds=self.settings.delete_grace_seconds,
                propagation_policy="Background",
            )
        except NotFound:
            return False
        return True

    def watch_pods(
        self, label_selector: str, resource_version: str, on_response: Callable[[Any], None]
    ) -> Iterator[dict[str, Any]]:
        """Watch events (dicts with ``type`` and ``object``) from ``resource_version`` on.

        Runs in the caller's thread; ``on_response`` receives the streaming HTTP
        response so another thread can shut it down to stop the watch at once.
        A too-old ``resource_version`` raises ``Gone`` (as an HTTP 410 or as an
        ERROR event carrying code 410, the way the API server sends it).
        """
        try:
            resp: Any = self.core.list_namespaced_pod(
                self.namespace,
                label_selector=label_selector,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version,
                timeout_seconds=self.settings.watch_timeout_seconds,
                _preload_content=False,
                _request_timeout=(
                    self.settings.request_timeout_seconds,
                    self.settings.watch_timeout_seconds + 15,
                ),
            )
        except ApiException as exc:
            raise _classify(exc) from None
        on_response(resp)
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if not line:
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    code = int(obj.get("code", 500))
                    msg = f"{obj.get('reason', '')}: {obj.get('message', '')}"
                    if code == 410:
                        raise Gone(code, msg)
                    raise BackendError.failure(f"watch error {code}: {msg}")
                yield event
        finally:
            resp.release_conn()

    # ---- network policies -------------------------------------------------------

    async def apply_network_policy(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create ``manifest``, or replace the existing policy of that name."""
        name = manifest["metadata"]["name"]
        try:
            result: dict[str, Any] = await self._run(
                self.net.create_namespaced_network_policy, self.namespace, manifest
            )
            return result
        except Conflict:
            current = await self._run(self.net.read_namespaced_network_policy, name, self.namespace)
            body = json.loads(json.dumps(manifest))
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            replaced: dict[str, Any] = await self._run(
                self.net.replace_namespaced_network_policy, name, self.namespace, body
            )
            return replaced

    async def delete_network_policy(self, name: str) -> bool:
        try:
            await self._run(self.net.delete_namespaced_network_policy, name, self.namespace)
        except NotFound:
            return False
        return True

    # ---- sandboxes' own token Secrets ---------------------------------------------

    async def create_secret(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create ``manifest``; an existing Secret of that name is returned as it is (a
        retried create of the same sandbox: the caller checks it is its own)."""
        try:
            result: dict[str, Any] = await self._run(
                self.core.create_namespaced_secret, self.namespace, manifest
            )
            return result
        except Conflict:
            name = manifest["metadata"]["name"]
            current: dict[str, Any] = await self._run(
                self.core.read_namespaced_secret, name, self.namespace
            )
            return current

    async def patch_secret(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._run(
            self.core.patch_namespaced_secret,
            name,
            self.namespace,
            patch,
            _content_type=MERGE_PATCH,
        )
        return result

    async def delete_secret(self, name: str) -> bool:
        try:
            await self._run(self.core.delete_namespaced_secret, name, self.namespace)
        except NotFound:
            return False
        return True

    # ---- the egress proxy's table (a ConfigMap in the control namespace) -----------

    async def patch_config_map(
        self, name: str, namespace: str, patch: dict[str, Any], create_if_missing: bool = True
    ) -> dict[str, Any] | None:
        """Merge-patch one ConfigMap (creating it when missing); None if missing and not made.

        A merge patch of single ``data`` keys needs no resourceVersion: the API
        server applies it atomically, so concurrent sandboxes never lose each
        other's entries.
        """
        try:
            result: dict[str, Any] = await self._run(
                self.core.patch_namespaced_config_map,
                name,
                namespace,
                patch,
                _content_type=MERGE_PATCH,
            )
            return result
        except NotFound:
            if not create_if_missing:
                return None
        data = {k: v for k, v in (patch.get("data") or {}).items() if v is not None}
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "orchard"},
            },
            "data": data,
        }
        try:
            created: dict[str, Any] = await self._run(
                self.core.create_namespaced_config_map, namespace, body
            )
            return created
        except Conflict:
            # Made by someone else in between: patch that one.
            return await self.patch_config_map(name, namespace, patch, create_if_missing=False)
