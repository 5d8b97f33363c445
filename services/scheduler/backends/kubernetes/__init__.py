"""The ``kubernetes`` backend: sandboxes as pods (see ``backend`` and ``manifests``)."""

from .backend import KubernetesBackend
from .settings import KubernetesSettings, PodTemplate

__all__ = ["KubernetesBackend", "KubernetesSettings", "PodTemplate"]
