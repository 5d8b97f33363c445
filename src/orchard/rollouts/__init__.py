"""Rollouts: run a harness on a task in a fresh sandbox with a recorded model session.

The contract (:mod:`orchard.rollouts._types`) is shared by the real harness CLIs of the tools
layer and the recipes' built-in agent loops; the runner (:mod:`orchard.rollouts.runner`) lives
beside it and talks to Orchard only through the public SDK and to the recording proxy only
over its HTTP API (:mod:`orchard.rollouts.proxy`). See ``docs/rollouts.md``.
"""

from ._types import Harness, HarnessRun, Limits, ModelEndpoint, RolloutResult, Status, Task
from .proxy import ModelProxyClient, ProxyError, ProxySession, local_proxy_url
from .runner import Grader, Job, RunnerOptions, SandboxOptions, run_rollout, run_rollouts

__all__ = [
    "Grader",
    "Harness",
    "HarnessRun",
    "Job",
    "Limits",
    "ModelEndpoint",
    "ModelProxyClient",
    "ProxyError",
    "ProxySession",
    "RolloutResult",
    "RunnerOptions",
    "SandboxOptions",
    "Status",
    "Task",
    "local_proxy_url",
    "run_rollout",
    "run_rollouts",
]
