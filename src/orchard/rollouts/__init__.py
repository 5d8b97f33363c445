"""Rollouts: run a harness on a task in a fresh sandbox with a recorded model session.

The contract (:mod:`orchard.rollouts._types`) is shared by the real harness CLIs of the tools
layer and the recipes' built-in agent loops; the runner lives beside it and talks to Orchard
only through the public SDK and to the recording proxy only over its HTTP API.
"""

from ._types import Harness, HarnessRun, Limits, ModelEndpoint, RolloutResult, Status, Task

__all__ = ["Harness", "HarnessRun", "Limits", "ModelEndpoint", "RolloutResult", "Status", "Task"]
