"""The two baseline harnesses every task is checked with: the oracle (its reference solution)
and the null run (no action at all).

A task is valid when its oracle passes and its null run fails (``runner.check_tasks``): a
task the oracle cannot pass is broken; a task nobody has to act on to pass grades nothing.
Both run in the driver's process, in a real sandbox with the real services, and call no
model (the runner still opens a proxy session; it records no calls).

The oracle's tool calls go through :meth:`ClawServices.call_tool`, exactly as the ReAct
loop's do, so they are audited like an agent's; a call the services refuse is kept in
``detail["oracle_errors"]`` (a task whose own oracle is refused is broken, and says so). A
script oracle runs ``sh -c`` in its workdir with ``$CLAW_API`` set to the services' HTTP base.
"""

from __future__ import annotations

import json
from typing import Any

from orchard.rollouts import HarnessRun, Status

from .harness import TrialContext
from .tasks import ScriptOracle


class NullHarness:
    """Does nothing and gives no answer."""

    name = "null"
    needs_tools_layer = False
    runs_in_sandbox = False

    async def run_claw(self, trial: TrialContext) -> HarnessRun:
        return HarnessRun(Status.COMPLETED, 0, None, [], None, {"stop_reason": "null run"})


def _refused(answer: str) -> str | None:
    """The error of a refused call (``{"ok": false, "error": ...}``), else None."""
    try:
        data = json.loads(answer)
    except ValueError:
        return f"not JSON: {answer[:200]!r}"
    if isinstance(data, dict) and data.get("ok") is False:
        return json.dumps(data.get("error"))[:500]
    return None


class OracleHarness:
    """Runs the task's reference solution."""

    name = "oracle"
    needs_tools_layer = False
    runs_in_sandbox = False

    async def run_claw(self, trial: TrialContext) -> HarnessRun:
        sandbox, services, oracle = trial.sandbox, trial.services, trial.task.oracle
        transcript: list[dict[str, Any]] = []
        errors: list[str] = []
        if isinstance(oracle, ScriptOracle):
            env = {"CLAW_API": services.http_base_in_sandbox} if services is not None else None
            await sandbox.make_dir(oracle.workdir, parents=True)
            done = await sandbox.exec(["sh", "-c", "exec 2>&1\n" + oracle.command],
                                      cwd=oracle.workdir, env=env, timeout=oracle.timeout)  # fmt: skip
            output = (done.stdout + done.stderr).decode("utf-8", "replace")
            transcript.append(
                {"script": oracle.command, "exit": done.exit_code, "output": output[-4000:]}
            )
            if done.exit_code != 0 or done.timed_out:
                errors.append(
                    f"script exited {done.exit_code}" + (" (timed out)" if done.timed_out else "")
                )
        else:
            if oracle.calls and services is None:
                return HarnessRun(Status.COMPLETED, 0, oracle.final_answer, transcript, None,
                                  {"oracle_errors": ["tool calls but no services"]})  # fmt: skip
            for n, call in enumerate(oracle.calls):
                assert services is not None
                answer = await services.call_tool(call.tool, call.args)
                transcript.append({"tool": call.tool, "args": call.args, "answer": answer})
                refused = _refused(answer)
                if refused is not None:
                    errors.append(f"call {n} ({call.tool}): {refused}")
        detail = {"stop_reason": "oracle", "oracle_errors": errors}
        return HarnessRun(Status.COMPLETED, len(transcript), oracle.final_answer or None,
                          transcript, None, detail)  # fmt: skip
