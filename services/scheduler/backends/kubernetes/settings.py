"""Settings of the Kubernetes backend: frozen dataclasses whose defaults match the Helm chart.

Nothing here talks to a cluster: building settings has no side effects (the API
client is made when the backend starts), so tests and the chart can share them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchard.common.layout import NodeLayout, orchard_home

GIB = 1 << 30

# The same capabilities Docker grants minus the network and file-system ones a
# sandbox never needs: enough for a root task to chown, switch users (orchard-init
# starts commands as the requested uid/gid) and signal its own processes.
DEFAULT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")


@dataclass(frozen=True)
class PodTemplate:
    """How a sandbox pod of one template (= one warm pool) looks, beyond image and resources."""

    name: str = "default"
    """Template name; becomes the pod's ``orchard.dev/pool`` label."""
    image: str = ""
    """The task image, used unmodified; "" = ``KubernetesSettings.default_image``."""
    cpu_millis: int = 1000
    memory_bytes: int = GIB
    ephemeral_storage_bytes: int = 0
    """Scratch-disk limit (requests = limits); 0 = no limit."""
    network_class: str = "none"
    """Policy class: none | allowlist | internet (selects the class NetworkPolicy)."""
    runtime_class_name: str = ""
    """e.g. "gvisor" or "kata"; "" = the cluster's default runtime."""
    run_as_non_root: bool = False
    """True only for images that run as a non-root user (the kubelet refuses root then)."""
    run_as_user: int | None = None
    """uid (and gid, fsGroup) for run_as_non_root; required with it."""
    capabilities_add: tuple[str, ...] = DEFAULT_CAPABILITIES
    """Added after dropping ALL."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """e.g. a spot node pool: ``{"cloud.google.com/gke-spot": "true"}``."""
    tolerations: tuple[Mapping[str, str], ...] = ()
    """e.g. ``({"key": "orchard.dev/spot", "operator": "Exists", "effect": "NoSchedule"},)``."""
    priority_class_name: str = ""


@dataclass(frozen=True)
class KubernetesSettings:
    namespace: str = "orchard-sandboxes"
    """Namespace of the sandbox pods (the scheduler's RBAC covers this namespace only)."""
    control_namespace: str = "orchard"
    """Namespace of the gateway and scheduler (allowed to reach executors)."""
    api_host: str = ""
    """API server URL; "" = in-cluster config when running in a pod, else the kubeconfig."""
    kubeconfig: Path | None = None
    """Kubeconfig file; None = ``$KUBECONFIG`` or ``~/.kube/config``."""
    default_image: str = "debian:bookworm-slim"
    bundle_image: str = "orchard/executor-bundle:0.1.0"
    """Image of the init container holding the executor bundle under ``/orchard-bundle``."""
    bundle_path_in_image: str = "/orchard-bundle"
    mount_path: str = "/.orchard"
    """Where the bundle appears in the task container (read-only)."""
    executor_port: int = 7070
    templates: Mapping[str, PodTemplate] = field(default_factory=dict)
    """Pod templates by name; ``default_template`` is used for plain creates."""
    default_template: PodTemplate = field(default_factory=PodTemplate)
    ttl_backstop_grace_seconds: int = 300
    """``activeDeadlineSeconds`` = age + ttl + this: the kubelet ends a pod the scheduler forgot."""
    unclaimed_lifetime_seconds: int = 24 * 3600
    """Deadline of a warm-pool pod until it is claimed (lowered at claim)."""
    ready_timeout_seconds: float = 180.0
    """A create that is not Ready by then fails (image pulls on a cold node are slow)."""
    watch_timeout_seconds: int = 60
    """Server-side timeout of one watch call; the cache reconnects from its resourceVersion."""
    request_timeout_seconds: float = 30.0
    max_retries: int = 5
    """Attempts for 429 / 5xx answers (honouring Retry-After)."""
    max_retry_after_seconds: float = 10.0
    delete_grace_seconds: int = 0
    """Pods hold no state worth a graceful stop: delete at once."""
    egress_proxy_service: str = "orchard-egress-proxy"
    """Service of the egress proxy in ``control_namespace`` (class ``allowlist`` pods get
    ``HTTP(S)_PROXY`` pointing at it)."""
    egress_proxy_port: int = 3128
    cluster_cidrs: tuple[str, ...] = ()
    """The pod and service CIDRs: cut out of every allowlist block, and blocks inside
    them are refused (``netpolicy.k8s``)."""
    revocations_file: Path | None = None
    """``revocations.json`` (tenant -> the moment before which its data-plane tokens are
    void) the scheduler pushes to the tenants' pods (``revocation_push``); None = none."""
    revocation_check_seconds: float = 0.5
    """How often that file is looked at (and undelivered notices retried)."""

    @classmethod
    def from_env(cls, home: Path | None = None) -> KubernetesSettings:
        """Settings from ``ORCHARD_K8S_*`` variables (what the Helm chart sets) and the
        per-pool pod settings (``pod_settings``): the file ``$ORCHARD_K8S_POD_SETTINGS``
        names (it must exist), else ``<home>/pods.json`` if there (where the chart
        mounts it; ``home`` defaults to ``$ORCHARD_HOME``).

        Raises ``pod_settings.PodSettingsError`` naming the pool and field when
        pods.json is invalid: a scheduler must not start with pools it misreads.
        """
        from .pod_settings import POD_SETTINGS_FILE, load_pod_settings

        env = os.environ
        kubeconfig = env.get("KUBECONFIG")
        named = env.get("ORCHARD_K8S_POD_SETTINGS", "")
        pods_file = Path(named) if named else (home or orchard_home()) / POD_SETTINGS_FILE
        templates = load_pod_settings(pods_file) if named or pods_file.exists() else {}
        revocations = env.get("ORCHARD_K8S_REVOCATIONS_FILE", "")
        return cls(
            templates=templates,
            namespace=env.get("ORCHARD_K8S_NAMESPACE", cls.namespace),
            control_namespace=env.get("ORCHARD_K8S_CONTROL_NAMESPACE", cls.control_namespace),
            api_host=env.get("ORCHARD_K8S_API_HOST", ""),
            kubeconfig=Path(kubeconfig.split(os.pathsep)[0]) if kubeconfig else None,
            default_image=env.get("ORCHARD_K8S_DEFAULT_IMAGE", cls.default_image),
            bundle_image=env.get("ORCHARD_K8S_BUNDLE_IMAGE", cls.bundle_image),
            executor_port=int(env.get("ORCHARD_K8S_EXECUTOR_PORT", cls.executor_port)),
            egress_proxy_service=env.get("ORCHARD_K8S_EGRESS_PROXY", cls.egress_proxy_service),
            egress_proxy_port=int(env.get("ORCHARD_K8S_EGRESS_PROXY_PORT", cls.egress_proxy_port)),
            cluster_cidrs=tuple(
                c.strip() for c in env.get("ORCHARD_K8S_CLUSTER_CIDRS", "").split(",") if c.strip()
            ),
            revocations_file=(
                Path(revocations) if revocations else NodeLayout(home or orchard_home()).revocations
            ),
        )

    def template(self, name: str) -> PodTemplate:
        if not name or name == self.default_template.name:
            return self.templates.get(name or self.default_template.name, self.default_template)
        return self.templates[name]

    @property
    def egress_proxy_url(self) -> str:
        host = f"{self.egress_proxy_service}.{self.control_namespace}.svc"
        return f"http://{host}:{self.egress_proxy_port}"

    @property
    def run_dir(self) -> str:
        """The executor's run folder (sandbox.json, init.sock, token.key): a writable emptyDir."""
        return f"{self.mount_path}/run"
