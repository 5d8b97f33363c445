"""Orchard Env: isolated sandboxes for training and evaluating AI agents.

The public API is the SDK, re-exported here::

    from orchard import Sandbox, AsyncSandbox, SandboxError
"""

from orchard.client import *  # noqa: F403
from orchard.client import __all__ as __all__
