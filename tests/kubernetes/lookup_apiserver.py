"""A FAKE Kubernetes API server that answers only what ``helm install --dry-run=server``
asks, so the chart's ``lookup`` runs in Helm's real engine (no cluster can run here).

It serves ``/version``, discovery for the kinds the chart renders, GET of the objects a
test puts in it, and 404 for everything else. Helm's server dry run only reads (it
checks each rendered object for an existing one and runs ``lookup``); it writes nothing.
OpenAPI validation is turned off in the call (this fake has no schemas; the chart's
objects are validated against the real schemas in test_helm_chart.py).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_KINDS: dict[str, list[tuple[str, str, bool]]] = {
    "v1": [
        ("secrets", "Secret", True),
        ("configmaps", "ConfigMap", True),
        ("services", "Service", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("namespaces", "Namespace", False),
    ],
    "apps/v1": [("deployments", "Deployment", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "rbac.authorization.k8s.io/v1": [
        ("roles", "Role", True),
        ("rolebindings", "RoleBinding", True),
    ],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy", True)],
}


def _resources(group_version: str) -> dict[str, Any]:
    verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {"name": n, "singularName": "", "namespaced": ns, "kind": k, "verbs": verbs}
            for n, k, ns in _KINDS[group_version]
        ],
    }


def _groups() -> dict[str, Any]:
    groups = []
    for gv in _KINDS:
        if "/" in gv:
            group, version = gv.split("/")
            entry = {"groupVersion": gv, "version": version}
            groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


class LookupApiServer:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                outer.requests.append(f"{self.command} {path}")
                version = re.fullmatch(r"/apis/(.+)", path)
                if self.command != "GET":
                    self._send(405, {"kind": "Status", "code": 405})
                elif path == "/version":
                    self._send(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0"})
                elif path == "/api":
                    self._send(200, {"kind": "APIVersions", "versions": ["v1"]})
                elif path == "/apis":
                    self._send(200, _groups())
                elif path == "/api/v1":
                    self._send(200, _resources("v1"))
                elif version and version.group(1) in _KINDS:
                    self._send(200, _resources(version.group(1)))
                elif path in outer.objects:
                    self._send(200, outer.objects[path])
                else:
                    self._send(404, {"kind": "Status", "reason": "NotFound", "code": 404})

            do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> LookupApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def put_secret(
        self, namespace: str, name: str, data: dict[str, str], release: tuple[str, str]
    ) -> None:
        """A Secret as an earlier ``helm install`` of ``release`` left it (Helm's ownership
        label and annotations, so the dry run adopts it rather than refusing); ``release`` is
        (release name, release namespace)."""
        self.objects[f"/api/v1/namespaces/{namespace}/secrets/{name}"] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
                "annotations": {
                    "meta.helm.sh/release-name": release[0],
                    "meta.helm.sh/release-namespace": release[1],
                },
            },
            "type": "Opaque",
            "data": data,
        }

    def kubeconfig(self) -> str:
        host, port = self._server.server_address[:2]
        return (
            "apiVersion: v1\nkind: Config\n"
            f'clusters: [{{name: fake, cluster: {{server: "http://{host!s}:{port}"}}}}]\n'
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
            "users: [{name: fake, user: {token: fake}}]\ncurrent-context: fake\n"
        )
