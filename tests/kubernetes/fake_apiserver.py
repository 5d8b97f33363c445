"""A FAKE Kubernetes API server for offline tests (no cluster can run on these machines).

It speaks enough of the real HTTP API for the real ``kubernetes`` client:
pods, NetworkPolicies, ConfigMaps and Secrets (create, get, list, replace, JSON merge patch,
delete), label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, exists,
``!key``), list resourceVersions, watch streams (ADDED/MODIFIED/DELETED,
including objects leaving or entering a selector), optimistic concurrency
(409 Conflict on a stale ``metadata.resourceVersion``, 409 AlreadyExists),
410 Gone for a watch from a compacted resourceVersion (the ERROR event the
real server sends), injected faults (e.g. 429 with ``Retry-After``), and the
garbage collector's one job the tests rely on: deleting a pod deletes the
objects whose ``ownerReferences`` name its uid.

It also plays a tiny kubelet: a new pod becomes Running and Ready with a
loopback pod IP after ``ready_delay`` seconds, unless its image starts with
``missing/`` (then it waits in ErrImagePull). Tests can set a pod's status
(preemption, deadline) by hand. It is a fake: no scheduling, no admission,
no validation beyond what the tests rely on (the schemas are checked
separately with kubernetes-validate).
"""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

Obj = dict[str, Any]

_PATH_RE = re.compile(
    r"^/(?:api/v1|apis/networking\.k8s\.io/v1)/namespaces/(?P<ns>[^/]+)/(?P<kind>pods|networkpolicies|configmaps|secrets)(?:/(?P<name>[^/]+))?$"
)


# ---- label selectors -------------------------------------------------------------


def parse_selector(text: str) -> list[Callable[[dict[str, str]], bool]]:
    """Kubernetes label selector syntax -> one predicate per requirement."""
    reqs: list[Callable[[dict[str, str]], bool]] = []
    parts = re.findall(r"[^,(]+(?:\([^)]*\))?", text or "")
    for raw in parts:
        part = raw.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", part)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                reqs.append(lambda ls, k=key, vs=values: ls.get(k) in vs)
            else:
                reqs.append(lambda ls, k=key, vs=values: ls.get(k) not in vs)
            continue
        m = re.fullmatch(r"(\S+?)\s*(==|!=|=)\s*(\S*)", part)
        if m:
            key, op, value = m.groups()
            if op == "!=":
                reqs.append(lambda ls, k=key, v=value: ls.get(k) != v)
            else:
                reqs.append(lambda ls, k=key, v=value: ls.get(k) == v)
            continue
        if part.startswith("!"):
            reqs.append(lambda ls, k=part[1:]: k not in ls)
        else:
            reqs.append(lambda ls, k=part: k in ls)
    return reqs


def selector_matches(reqs: list[Callable[[dict[str, str]], bool]], obj: Obj | None) -> bool:
    if obj is None:
        return False
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(r(labels) for r in reqs)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Fault:
    method: str
    path_contains: str
    status: int
    retry_after: int | None
    remaining: int


@dataclass
class Event:
    rv: int
    kind: str
    namespace: str
    type: str
    obj: Obj
    old: Obj | None


class FakeApiServer:
    """Start with ``start()``; ``url`` is what the client's Configuration.host takes."""

    def __init__(self, ready_delay: float = 0.05, pod_ip_prefix: str = "127.0.100.") -> None:
        self.ready_delay = ready_delay
        self.auto_ready = True
        self._pod_ip_prefix = pod_ip_prefix
        self._ips = 0
        self._lock = threading.Condition()
        self._objects: dict[tuple[str, str, str], Obj] = {}
        self._events: list[Event] = []
        self._rv = 100
        self._compacted_rv = 0
        self._faults: list[Fault] = []
        self._closing = False
        self.requests: list[tuple[str, str]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._timers: list[threading.Timer] = []
        self._watch_gate = threading.Event()
        self._watch_gate.set()

    # ---- life and test hooks ------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        for t in self._timers:
            t.cancel()
        self._server.shutdown()
        self._server.server_close()

    def inject(
        self,
        method: str,
        path_contains: str,
        status: int,
        *,
        retry_after: int | None = None,
        times: int = 1,
    ) -> None:
        """The next ``times`` matching requests get ``status`` (e.g. 429 with Retry-After)."""
        with self._lock:
            self._faults.append(Fault(method, path_contains, status, retry_after, times))

    def compact(self) -> None:
        """Forget the event history: watches from older resourceVersions get 410 Gone."""
        with self._lock:
            self._events.clear()
            self._compacted_rv = self._rv
            self._lock.notify_all()

    def drop_watches(self) -> None:
        """End every open watch stream (as an API server restart or load balancer would)."""
        with self._lock:
            self._rv += 1
            self._events.append(Event(self._rv, "__drop__", "", "DROP", {}, None))
            self._lock.notify_all()

    def pause_watches(self) -> None:
        """Hold new watch requests (not lists) until ``resume_watches``: a client falls behind."""
        self._watch_gate.clear()

    def resume_watches(self) -> None:
        self._watch_gate.set()

    def pod(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            obj = self._objects.get(("pods", namespace, name))
            return copy.deepcopy(obj) if obj else None

    def pods(self, namespace: str) -> list[Obj]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (k, ns, _), o in self._objects.items()
                if k == "pods" and ns == namespace
            ]

    def objects(self, kind: str, namespace: str) -> list[Obj]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (k, ns, _), o in self._objects.items()
                if k == kind and ns == namespace
            ]

    def set_status(self, namespace: str, name: str, status: Obj) -> None:
        """What the kubelet or the control plane would write (merge-patched into status)."""
        with self._lock:
            key = ("pods", namespace, name)
            old = self._objects.get(key)
            if old is None:
                raise KeyError(name)
            new = copy.deepcopy(old)
            new["status"] = merge_patch(new.get("status") or {}, status)
            self._commit(key, "MODIFIED", new, old)

    # ---- storage (lock held) ------------------------------------------------------

    def _commit(self, key: tuple[str, str, str], type_: str, obj: Obj, old: Obj | None) -> Obj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if type_ == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = obj
        self._events.append(
            Event(
                self._rv,
                key[0],
                key[1],
                type_,
                copy.deepcopy(obj),
                copy.deepcopy(old) if old else None,
            )
        )
        self._lock.notify_all()
        return copy.deepcopy(obj)

    def _collect_garbage(self, namespace: str, owner_uid: str | None) -> None:
        """What the garbage collector does (later, in a real cluster): remove the objects
        owned by a deleted one."""
        for key, obj in list(self._objects.items()):
            owners = (obj.get("metadata") or {}).get("ownerReferences") or []
            if key[1] == namespace and any(o.get("uid") == owner_uid for o in owners):
                self._commit(key, "DELETED", copy.deepcopy(obj), obj)

    def _kubelet_start(self, namespace: str, name: str) -> None:
        with self._lock:
            pod = self._objects.get(("pods", namespace, name))
            if pod is None or self._closing:
                return
            image = pod["spec"]["containers"][0].get("image", "")
            if image.startswith("missing/"):
                status: Obj = {
                    "phase": "Pending",
                    "containerStatuses": [
                        {
                            "name": pod["spec"]["containers"][0]["name"],
                            "image": image,
                            "ready": False,
                            "restartCount": 0,
                            "state": {
                                "waiting": {"reason": "ErrImagePull", "message": "not found"}
                            },
                        }
                    ],
                }
            else:
                self._ips += 1
                status = {
                    "phase": "Running",
                    "podIP": f"{self._pod_ip_prefix}{self._ips % 250 + 1}",
                    "startTime": _now(),
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            new = copy.deepcopy(pod)
            new["status"] = merge_patch(new.get("status") or {}, status)
            self._commit(("pods", namespace, name), "MODIFIED", new, pod)

    # ---- HTTP ----------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in separate writes: without this, Nagle
                # plus the client's delayed ACK adds ~40 ms to every answer.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _send(self, code: int, body: Obj, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _status(
                self, code: int, reason: str, message: str, headers: dict[str, str] | None = None
            ) -> None:
                self._send(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "reason": reason,
                        "message": message,
                        "code": code,
                    },
                    headers,
                )

            def _body(self) -> Any:
                return json.loads(self._raw or b"null")

            def _dispatch(self, method: str) -> None:
                # Read the whole body first, so an early answer never leaves
                # bytes behind on a keep-alive connection.
                length = int(self.headers.get("Content-Length") or 0)
                self._raw = self.rfile.read(length) if length else b""
                url = urlparse(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                with server._lock:
                    server.requests.append((method, url.path))
                    for fault in server._faults:
                        if (
                            fault.remaining > 0
                            and fault.method == method
                            and fault.path_contains in url.path
                        ):
                            fault.remaining -= 1
                            hdrs = (
                                {"Retry-After": str(fault.retry_after)}
                                if fault.retry_after is not None
                                else {}
                            )
                            reason = {
                                429: "TooManyRequests",
                                500: "InternalError",
                                503: "ServiceUnavailable",
                            }.get(fault.status, "Injected")
                            self._status(fault.status, reason, "injected by the test", hdrs)
                            return
                m = _PATH_RE.match(url.path)
                if not m:
                    self._status(404, "NotFound", f"the fake serves no {url.path}")
                    return
                ns, kind, name = m.group("ns"), m.group("kind"), m.group("name")
                if method == "GET" and name is None:
                    if query.get("watch") in ("true", "1"):
                        self._watch(ns, kind, query)
                    else:
                        self._list(ns, kind, query)
                    return
                if method == "POST" and name is None:
                    self._create(ns, kind, self._body())
                    return
                if name is None:
                    self._status(405, "MethodNotAllowed", method)
                    return
                if method == "GET":
                    with server._lock:
                        obj = server._objects.get((kind, ns, name))
                        body = copy.deepcopy(obj) if obj else None
                    if body is None:
                        self._status(404, "NotFound", f'{kind} "{name}" not found')
                    else:
                        self._send(200, body)
                elif method == "DELETE":
                    self._delete(ns, kind, name)
                elif method in ("PUT", "PATCH"):
                    self._update(ns, kind, name, method)
                else:
                    self._status(405, "MethodNotAllowed", method)

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

            def do_PUT(self) -> None:
                self._dispatch("PUT")

            def do_PATCH(self) -> None:
                self._dispatch("PATCH")

            def do_DELETE(self) -> None:
                self._dispatch("DELETE")

            def _list(self, ns: str, kind: str, query: dict[str, str]) -> None:
                reqs = parse_selector(query.get("labelSelector", ""))
                with server._lock:
                    items = [
                        copy.deepcopy(o)
                        for (k, n, _), o in sorted(server._objects.items())
                        if k == kind and n == ns and selector_matches(reqs, o)
                    ]
                    rv = str(server._rv)
                list_kind = {
                    "pods": "PodList",
                    "networkpolicies": "NetworkPolicyList",
                    "configmaps": "ConfigMapList",
                    "secrets": "SecretList",
                }[kind]
                self._send(
                    200,
                    {
                        "kind": list_kind,
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": rv},
                        "items": items,
                    },
                )

            def _create(self, ns: str, kind: str, body: Obj) -> None:
                meta = body.setdefault("metadata", {})
                name = meta.get("name", "")
                meta["namespace"] = ns
                with server._lock:
                    if (kind, ns, name) in server._objects:
                        self._status(409, "AlreadyExists", f'{kind} "{name}" already exists')
                        return
                    meta["uid"] = str(uuid.uuid4())
                    meta["creationTimestamp"] = _now()
                    if kind == "pods":
                        body["status"] = {"phase": "Pending"}
                    created = server._commit((kind, ns, name), "ADDED", body, None)
                if kind == "pods" and server.auto_ready:
                    t = threading.Timer(server.ready_delay, server._kubelet_start, (ns, name))
                    t.daemon = True
                    server._timers.append(t)
                    t.start()
                self._send(201, created)

            def _update(self, ns: str, kind: str, name: str, method: str) -> None:
                ctype = self.headers.get("Content-Type", "")
                if method == "PATCH" and ctype != "application/merge-patch+json":
                    self._status(
                        415,
                        "UnsupportedMediaType",
                        f"the fake takes merge patches only, not {ctype}",
                    )
                    return
                body = self._body()
                with server._lock:
                    old = server._objects.get((kind, ns, name))
                    if old is None:
                        self._status(404, "NotFound", f'{kind} "{name}" not found')
                        return
                    want_rv = ((body or {}).get("metadata") or {}).get("resourceVersion")
                    if want_rv is not None and want_rv != old["metadata"]["resourceVersion"]:
                        self._status(
                            409,
                            "Conflict",
                            f'Operation cannot be fulfilled on {kind} "{name}": the object has been modified; please apply your changes to the latest version and try again',
                        )
                        return
                    if method == "PATCH":
                        new = merge_patch(copy.deepcopy(old), body)
                    else:
                        new = copy.deepcopy(body)
                        new["status"] = copy.deepcopy(old.get("status"))
                    for fixed in ("uid", "creationTimestamp", "name", "namespace"):
                        new["metadata"][fixed] = old["metadata"].get(fixed)
                    if kind == "pods":
                        old_dl = (old.get("spec") or {}).get("activeDeadlineSeconds")
                        new_dl = (new.get("spec") or {}).get("activeDeadlineSeconds")
                        if old_dl and (not new_dl or new_dl > old_dl):
                            self._status(
                                422, "Invalid", "spec.activeDeadlineSeconds: may only be decreased"
                            )
                            return
                    updated = server._commit((kind, ns, name), "MODIFIED", new, old)
                self._send(200, updated)

            def _delete(self, ns: str, kind: str, name: str) -> None:
                with server._lock:
                    old = server._objects.get((kind, ns, name))
                    if old is None:
                        self._status(404, "NotFound", f'{kind} "{name}" not found')
                        return
                    gone = server._commit((kind, ns, name), "DELETED", copy.deepcopy(old), old)
                    server._collect_garbage(ns, old["metadata"].get("uid"))
                self._send(200, gone)

            def _watch(self, ns: str, kind: str, query: dict[str, str]) -> None:
                reqs = parse_selector(query.get("labelSelector", ""))
                timeout = float(query.get("timeoutSeconds", "30"))
                since = int(query.get("resourceVersion") or "0")
                server._watch_gate.wait(timeout)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def chunk(obj: Obj) -> None:
                    data = json.dumps(obj).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()

                deadline = time.monotonic() + timeout
                try:
                    with server._lock:
                        if since and since < server._compacted_rv:
                            chunk(
                                {
                                    "type": "ERROR",
                                    "object": {
                                        "kind": "Status",
                                        "apiVersion": "v1",
                                        "status": "Failure",
                                        "reason": "Expired",
                                        "message": f"too old resource version: {since} ({server._compacted_rv})",
                                        "code": 410,
                                    },
                                }
                            )
                            self.wfile.write(b"0\r\n\r\n")
                            return
                        cursor = since or server._rv
                    while True:
                        with server._lock:
                            fresh = [e for e in server._events if e.rv > cursor]
                            if not fresh and not server._closing:
                                left = deadline - time.monotonic()
                                if left <= 0:
                                    break
                                server._lock.wait(min(left, 0.5))
                                fresh = [e for e in server._events if e.rv > cursor]
                            if server._closing:
                                break
                        stop = False
                        for e in fresh:
                            cursor = max(cursor, e.rv)
                            if e.type == "DROP":
                                stop = True
                                break
                            if e.kind != kind or e.namespace != ns:
                                continue
                            was, now = selector_matches(reqs, e.old), selector_matches(reqs, e.obj)
                            if e.type == "DELETED":
                                if was:
                                    chunk({"type": "DELETED", "object": e.obj})
                            elif now and not was:
                                chunk({"type": "ADDED", "object": e.obj})
                            elif now and was:
                                chunk({"type": "MODIFIED", "object": e.obj})
                            elif was and not now:
                                chunk({"type": "DELETED", "object": e.obj})
                        if stop or time.monotonic() >= deadline:
                            break
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass
                finally:
                    self.close_connection = True

        return Handler
