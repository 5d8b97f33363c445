"""``OrchardEnvironment``: mini-swe-agent's ``Environment`` on an Orchard sandbox.

mini-swe-agent takes an environment by import path (``environment_class`` in a
config, ``--environment-class`` on ``mini``). Its contract, as its own local
and Docker environments keep it:

- ``execute(action, cwd="", *, timeout=None)`` runs ``action["command"]``
  through ``interpreter`` and returns ``{"output", "returncode",
  "exception_info"}`` with stdout and stderr **merged** in write order (here:
  one pipe for both, made inside the sandbox, so the order is exact);
- a timeout kills the command's whole process tree (Orchard's exec timeout
  does) and is reported as mini-swe-agent reports its ``subprocess.TimeoutExpired``:
  returncode -1, the partial output, ``exception_info`` and ``extra``;
- an output whose first line is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (and
  returncode 0) raises ``Submitted`` with the rest as the submission;
- ``get_template_vars()`` (config, the *sandbox's* uname, the kwargs) and
  ``serialize()``.

What is not the command's doing (the sandbox lost, the platform failing) is
not an observation for the model: those Orchard errors propagate, and the
agent's run ends with that exception's name as its exit status.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge

import orchard

from .._sandbox_fields import SandboxFields

SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_MERGE_STREAMS = 'exec "$@" 2>&1'
"""Run the interpreter with fd 2 on fd 1's pipe: one stream, in write order."""
_UNAME_KEYS = ("system", "node", "release", "version", "machine")


class OrchardEnvironmentConfig(SandboxFields):
    """The sandbox and how commands run in it (the fields mirror Docker's environment)."""

    cwd: str = "/"
    """Working directory of every command."""
    env: dict[str, str] = {}
    """Environment variables set for every command."""
    forward_env: list[str] = []
    """Host variables passed on when set (``env`` wins on conflict)."""
    timeout: int = 30
    """Seconds a command may run."""
    interpreter: list[str] = ["bash", "-lc"]
    """The command is appended to this argv."""


class OrchardEnvironment:
    """Commands of a mini-swe-agent run, in one Orchard sandbox."""

    def __init__(
        self,
        *,
        config_class: type[OrchardEnvironmentConfig] = OrchardEnvironmentConfig,
        logger: logging.Logger | None = None,
        client: orchard.Orchard | None = None,
        **kwargs: Any,
    ) -> None:
        self.config = config_class(**kwargs)
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self.client = client or orchard.Orchard()
        self._owns_sandbox = self.config.sandbox_id is None
        self._cleaned = False
        cfg = self.config
        if cfg.sandbox_id is not None:
            self.sandbox = self.client.sandboxes.connect(cfg.sandbox_id)
        else:
            self.sandbox = self.client.sandboxes.create(
                **cfg.create_arguments("mini-swe-agent/environment")
            )
        self.logger.info("Started Orchard sandbox %s", self.sandbox.id)
        self._uname: dict[str, str] | None = None

    def execute(
        self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None
    ) -> dict[str, Any]:
        command = action.get("command", "")
        seconds = timeout or self.config.timeout
        env = {k: v for k in self.config.forward_env if (v := os.environ.get(k)) is not None}
        argv = ["/bin/sh", "-c", _MERGE_STREAMS, "sh", *self.config.interpreter, command]
        try:
            result = self.sandbox.exec(
                argv, timeout=seconds, cwd=cwd or self.config.cwd, env={**env, **self.config.env}
            )
        except orchard.DeadlineExceededError:
            # The reply did not come back in time: for the agent, the command timed out.
            result = None
        # stderr carries only what the executor itself says (a missing /bin/sh).
        text = (
            ""
            if result is None
            else (result.stdout + result.stderr).decode("utf-8", errors="replace")
        )
        if result is None or result.timed_out:
            expired = subprocess.TimeoutExpired(command, seconds, output=text)
            output: dict[str, Any] = {
                "output": text,
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {expired}",
                "extra": {"exception_type": type(expired).__name__, "exception": str(expired)},
            }
        else:
            code = result.exit_code
            if result.status.signal:  # whatever exit_code convention the SDK reports it in
                code = -result.status.signal  # what subprocess reports for a signal death
            output = {"output": text, "returncode": code, "exception_info": ""}
        self._check_submitted(output)
        return output

    @staticmethod
    def _check_submitted(output: dict[str, Any]) -> None:
        first, _, rest = output["output"].lstrip().partition("\n")
        if first.strip() == SUBMIT_SENTINEL and output["returncode"] == 0:
            raise Submitted(
                {
                    "role": "exit",
                    "content": rest,
                    "extra": {"exit_status": "Submitted", "submission": rest},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config, the sandbox's ``uname`` (system, node, release, version,
        machine: what the local environment takes from ``platform.uname()``), kwargs."""
        return recursive_merge(self.config.model_dump(), self._sandbox_uname(), kwargs)  # type: ignore[no-any-return]

    def _sandbox_uname(self) -> dict[str, str]:
        if self._uname is None:
            flags = ("-s", "-n", "-r", "-v", "-m")
            result = self.sandbox.exec(["sh", "-c", "; ".join(f"uname {f}" for f in flags)])
            lines = result.stdout_text.splitlines()
            if result.exit_code != 0 or len(lines) != len(flags):
                raise orchard.SandboxError(
                    f"uname failed in sandbox {self.sandbox.id}: {result.stderr_text.strip()}"
                )
            self._uname = dict(zip(_UNAME_KEYS, lines, strict=True))
        return self._uname

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                    "orchard_sandbox_id": self.sandbox.id,
                }
            }
        }

    def cleanup(self) -> None:
        """Delete the sandbox (unless it was given by ``sandbox_id``)."""
        if self._owns_sandbox and not self._cleaned:
            self._cleaned = True
            with contextlib.suppress(orchard.SandboxNotFoundError):
                self.sandbox.delete()

    def __enter__(self) -> OrchardEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def __del__(self) -> None:
        # Like mini-swe-agent's Docker environment: a run that forgets cleanup()
        # still frees its sandbox (and the ttl reaps it if even this cannot run).
        with contextlib.suppress(Exception):
            if hasattr(self, "sandbox"):
                self.cleanup()
