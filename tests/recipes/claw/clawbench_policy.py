"""The scripted agent of the claw-bench live test: the Claw tests' oracle policy
(:class:`~tests.recipes.claw.policies.OraclePolicy`) over claw-bench's tasks, whose reference
solution is a script, not tool calls.

- the ReAct loop offers ``bash`` for a task without services: the oracle policy already plays a
  script oracle as one ``bash`` call of its command (``solve.sh`` written and run on
  ``/workspace``), then ``final_answer``;
- Codex offers ``exec_command`` (``{"cmd"}``): here step 0 runs the same command, then the
  answer is a plain message (Codex's last one).

``lazy`` tasks are answered at once, with no action: a model that does nothing, whose trials
the verifier must fail.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from orchard.recipes.claw.tasks import ClawTask, ScriptOracle

from .policies import OraclePolicy


class ReplayPolicy(OraclePolicy):
    def __init__(self, tasks: Sequence[ClawTask], lazy: Iterable[str] = ()) -> None:
        super().__init__(tasks, flaws=())
        self.lazy = set(lazy)

    def react(self, task: ClawTask, step: int) -> dict[str, Any]:
        if task.id in self.lazy:
            return self.final(task, step)
        return super().react(task, step)

    def shell(
        self, task: ClawTask, step: int, messages: list[dict[str, Any]], tool: str, field: str
    ) -> dict[str, Any]:
        assert isinstance(task.oracle, ScriptOracle), task.id
        if step == 0 and task.id not in self.lazy:
            args = json.dumps({field: task.oracle.command})
            return {"tool_calls": [{"id": "call-0", "name": tool, "arguments": args}]}
        return {"content": "Done."}
