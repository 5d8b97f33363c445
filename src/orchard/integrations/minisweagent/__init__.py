"""mini-swe-agent on Orchard: an ``Environment`` found by import path.

``pip install 'orchard-env[mini-swe-agent]'``, then in a mini-swe-agent config::

    environment:
      environment_class: orchard.integrations.minisweagent.OrchardEnvironment
      image: py
      cwd: /work

or ``mini --environment-class orchard.integrations.minisweagent.OrchardEnvironment``.
See docs/integrations/mini-swe-agent.md.
"""

from ._environment import SUBMIT_SENTINEL, OrchardEnvironment, OrchardEnvironmentConfig

__all__ = ["SUBMIT_SENTINEL", "OrchardEnvironment", "OrchardEnvironmentConfig"]
