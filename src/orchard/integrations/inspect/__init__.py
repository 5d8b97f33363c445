"""Inspect AI on Orchard: ``sandbox="orchard"`` in any task or sample.

Installed with ``pip install 'orchard-env[inspect]'``; Inspect finds the
provider through the ``inspect_ai`` entry point this package declares, so an
eval names it and imports nothing::

    Task(dataset=..., solver=..., scorer=..., sandbox="orchard")
    Sample(input=..., sandbox=("orchard", OrchardSandboxConfig(image="py", cpu=2)))

See docs/integrations/inspect.md.
"""

from ._config import OrchardAllowlist, OrchardSandboxConfig
from ._environment import OrchardSandboxEnvironment

__all__ = ["OrchardAllowlist", "OrchardSandboxConfig", "OrchardSandboxEnvironment"]
