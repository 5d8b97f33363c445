"""mini-swe-agent (PyPI ``mini-swe-agent``): the ``mini`` CLI, yolo mode, one task, no prompts.

Wire format: OpenAI **Chat** Completions with tool calls (its ``bash`` tool), through
LiteLLM with model ``openai/<model>`` and ``api_base`` = the session's
``openai_base_url_in_sandbox``; the key is a placeholder (the credential is in the URL).
LiteLLM's remote cost map is not fetched (``LITELLM_LOCAL_MODEL_COST_MAP``), cost tracking
ignores unknown models, the first-run setup prompt and startup banner are off, and model
retries are one attempt: a failing endpoint fails the run instead of minutes of back-off.

Limits: ``agent.step_limit`` = ``Limits.max_steps`` (model calls), the command timeout of
its bash tool = ``Limits.command_timeout``, the wall time = the run's timeout.

Transcript: its trajectory file (``-o``): the messages and ``info.exit_status``,
``info.submission``, ``info.model_stats.api_calls`` (the steps). ``Submitted`` is
COMPLETED, ``LimitsExceeded``/``TimeExceeded`` TRUNCATED, and an exit on an exception
from the model client (connection, HTTP status, authentication) ABORTED.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .._types import HarnessRun, Limits, ModelEndpoint, Status, Task
from ._cli import PLACEHOLDER_KEY, RUN_DIR, CliHarness

if TYPE_CHECKING:
    from orchard import AsyncSandbox, ExecResult

TRAJECTORY = f"{RUN_DIR}/mini.traj.json"
CONFIG = f"{RUN_DIR}/mini-orchard.yaml"

_TRUNCATED = {"LimitsExceeded", "TimeExceeded"}
_AGENT_OUTCOMES = {"Submitted", "RepeatedFormatError", "FormatError", *_TRUNCATED}


class MiniSweAgent(CliHarness):
    name = "mini-swe-agent"
    command = "mini"
    wire_format = "chat"
    version_args = ("--help",)

    def files(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        # JSON is YAML: no YAML writer needed for a config this small.
        config = {
            "agent": {"step_limit": limits.max_steps, "cost_limit": 0},
            "environment": {"timeout": int(limits.command_timeout), "cwd": task.workdir},
            "model": {
                "model_name": f"openai/{model.model}",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {
                    "api_base": model.openai_base_url_in_sandbox,
                    "api_key": PLACEHOLDER_KEY,
                    "drop_params": True,
                },
            },
        }
        return {CONFIG: json.dumps(config, indent=2)}

    def env(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        return {
            "MSWEA_CONFIGURED": "1",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{RUN_DIR}/mini-config",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENAI_API_KEY": PLACEHOLDER_KEY,
        }

    def argv(self, task: Task, model: ModelEndpoint, limits: Limits) -> list[str]:
        return [
            self.executable,
            "--yolo",
            "--exit-immediately",
            "--model",
            f"openai/{model.model}",
            "--config",
            "mini.yaml",
            "--config",
            CONFIG,
            "--output",
            TRAJECTORY,
            "--task",
            task.prompt,
        ]

    async def outcome(
        self, sandbox: AsyncSandbox, result: ExecResult, task: Task, limits: Limits
    ) -> HarnessRun:
        traj: dict[str, Any] = json.loads(await self.read_text(sandbox, TRAJECTORY))
        info = traj.get("info") or {}
        exit_status = str(info.get("exit_status") or "")
        steps = int((info.get("model_stats") or {}).get("api_calls") or 0)
        submission = info.get("submission") or None
        if exit_status == "Submitted" or exit_status in _AGENT_OUTCOMES - _TRUNCATED:
            status = Status.COMPLETED
            fault = None
        elif exit_status in _TRUNCATED:
            status, fault = Status.TRUNCATED, f"mini-swe-agent: {exit_status}"
        else:
            last = (traj.get("messages") or [{}])[-1]
            extra = last.get("extra") or {} if isinstance(last, dict) else {}
            status = Status.ABORTED
            fault = (
                f"mini-swe-agent exited on {exit_status or 'an unknown status'}: "
                f"{str(extra.get('exception_str') or '')[:1500]}"
            )
        return HarnessRun(
            status=status,
            steps=steps,
            submission=submission,
            transcript=traj,
            fault=fault,
            detail={"exit_status": exit_status},
        )
