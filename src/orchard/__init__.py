"""Orchard Env: isolated sandboxes for training and evaluating AI agents.

The public API is the SDK, re-exported here::

    from orchard import Sandbox, AsyncSandbox, SandboxError

``orchard.__version__`` is the installed distribution's version, read from its
metadata, so pyproject.toml's ``version`` is the one place it is written. A
source tree put on ``sys.path`` by hand has no metadata; its version is then
``0+unknown`` (PEP 440 for "not known"), never a guess.
"""

from importlib import metadata as _metadata

from orchard.client import *  # noqa: F403
from orchard.client import __all__ as __all__

try:
    __version__ = _metadata.version("orchard-env")
except _metadata.PackageNotFoundError:
    __version__ = "0+unknown"
