"""SWE-ReX on Orchard: a deployment and runtime for SWE-agent-style code.

``pip install 'orchard-env[swe-rex]'``, then::

    deployment = OrchardDeployment(image="py")
    await deployment.start()
    runtime = deployment.runtime   # an AbstractRuntime: sessions, execute, files

See docs/integrations/swe-rex.md.
"""

from ._deployment import OrchardDeployment, OrchardDeploymentConfig
from ._errors import OrchardUnavailableError
from ._runtime import OrchardRuntime

__all__ = [
    "OrchardDeployment",
    "OrchardDeploymentConfig",
    "OrchardRuntime",
    "OrchardUnavailableError",
]
