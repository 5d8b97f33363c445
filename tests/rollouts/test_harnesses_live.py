"""Real harness CLIs of the tools layer, end to end: each in its own sandbox with network
``none`` plus the model endpoint, driven by the scripted model server (through the recording
proxy, in the harness's own wire format and tool-call format) through the multi-step
calc_divide fix. The repository ends fixed (the hidden tests pass in the sandbox), the diff is
the gold patch, and every recorded sample is token-exact against what the server produced.

Needs the tools layer (``make tools-layer``). Which tools each harness defines was read from
its own request bodies (the scripted server keeps them): Codex's ``exec_command``
(``{"cmd"}``, over Responses), mini-swe-agent's ``bash``
(``{"command"}``, and it submits with ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``),
OpenClaw's ``exec`` (``{"command"}``), Claude Code's ``Bash`` (``{"command"}``, over
Messages). aider has no tools: it edits by text, so its script is one reply in its ``whole``
edit format (the fixed file), and aider runs the tests itself (``--auto-test``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from orchard import AsyncOrchard
from orchard.rollouts import Limits, ModelProxyClient, SandboxOptions, Status, run_rollout
from orchard.rollouts.harnesses import Aider, ClaudeCode, Codex, MiniSweAgent, OpenClaw
from tests.stack import REQUIRES_STACK, TOOLS_DIR

from .calc_policy import CalcPolicy, WholeFilePolicy, finish_with_text
from .calc_task import (
    SAMPLE,
    assert_samples_token_exact,
    calc_task,
    gold_patch,
    grade_hidden_tests,
    without_index_lines,
)
from .conftest import RolloutStack
from .test_runner_live import _left

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not any(TOOLS_DIR.glob("harnesses-*/layer.json")),
        reason=f"no tools layer under {TOOLS_DIR} (make tools-layer)",
    ),
]

LIMITS = Limits(max_steps=10, max_seconds=300, command_timeout=60)


def _call(name: str, field: str = "command") -> Callable[[str, str], dict[str, Any]]:
    def make(call_id: str, command: str) -> dict[str, Any]:
        return {"id": call_id, "name": name, "arguments": json.dumps({field: command})}

    return make


def _mini_submit(call_id: str) -> dict[str, Any]:
    return {
        "content": "Done: submitting.",
        "tool_calls": [_call("bash")(call_id, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")],
    }


@dataclass(frozen=True)
class Case:
    harness: Callable[
        [], Any
    ]  # a CliHarness class (its ClassVar name is no Protocol attribute to mypy)
    tool_call: Callable[[str, str], dict[str, Any]]
    finish: Callable[[str], dict[str, Any]] = finish_with_text
    api: str = "chat"
    policy: Callable[[Any], CalcPolicy] | None = None
    """A policy other than the tool-calling CalcPolicy (aider edits by text)."""


TESTS = "python3 -m pytest -q -p no:cacheprovider"
BUGGY = (SAMPLE / "repo" / "calc" / "__init__.py").read_text()
FIXED = BUGGY.replace("(len(values) + 1)", "len(values)")
AIDER = Aider(
    extra_args=(
        *("--edit-format", "whole", "--auto-test", "--test-cmd", TESTS),
        # its lint (flake8, by default) is not in the task image: a missing linter comes
        # back to the model as a lint error to fix
        "--no-auto-lint",
        "calc/__init__.py",
    )
)


CASES = {
    "codex": Case(Codex, _call("exec_command", "cmd"), api="responses"),
    "mini-swe-agent": Case(MiniSweAgent, _call("bash"), _mini_submit),
    "openclaw": Case(OpenClaw, _call("exec")),
    "claude-code": Case(ClaudeCode, _call("Bash"), api="messages"),
    # aider: one reply with the whole fixed file; aider writes it and runs the tests itself
    "aider": Case(
        lambda: AIDER,
        _call("none"),
        policy=lambda case: WholeFilePolicy(path="calc/__init__.py", fixed=FIXED),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_real_harness_fixes_the_sample_repository(rollout_stack: RolloutStack, name: str) -> None:
    case = CASES[name]
    policy = (
        case.policy(case)
        if case.policy
        else CalcPolicy(tool_call=case.tool_call, finish=case.finish)
    )
    rollout_stack.upstream.use(policy)
    task = calc_task()
    task = replace(task, id=f"calc-{name}", prompt=f"[rollout {name}] {task.prompt}")

    async def body(client: AsyncOrchard, proxy: ModelProxyClient) -> None:
        result = await run_rollout(
            client, case.harness(), task, proxy=proxy, model="scripted", limits=LIMITS,
            grade=grade_hidden_tests, sandbox=SandboxOptions(memory="2Gi"),
        )  # fmt: skip
        assert result.status is Status.COMPLETED, (result.fault, result.detail.get("harness"))
        assert result.reward == 1.0
        assert without_index_lines(result.diff) == gold_patch(), result.diff
        calls = await proxy.calls(result.session_id or "")
        assert {c["api"] for c in calls} == {case.api}
        assert_samples_token_exact(
            result, calls, policy.answered[name] + policy.answered.get("", [])
        )
        assert all(s["reward"] == 1.0 and s["trainable"] for s in result.samples)
        if isinstance(policy, WholeFilePolicy):
            # aider ran the tests itself after its edit (--auto-test); passing, they are not
            # sent back to the model (only a failure is), so they show in its output
            output = result.detail["harness"]["stdout_tail"]
            assert re.search(r"\b\d+ passed in", output) and " failed" not in output, output
            assert len(policy.answered[name]) == 1  # the edit; no reflection (lint, tests)
        else:
            # the agent ran the tests itself (step 3) and saw them pass before it finished
            tool_outputs = [
                m for b, _e in policy.answered[name] for m in b["messages"] if m["role"] == "tool"
            ]
            assert any("passed" in str(m.get("content")) for m in tool_outputs)
        offered = sorted(
            t["function"]["name"] for t in policy.answered[name][0][0].get("tools") or []
        )
        if isinstance(policy, WholeFilePolicy):
            assert offered == []  # aider edits by text: no tools
        else:  # the script calls a tool the harness itself defined
            assert case.tool_call("c", "true")["name"] in offered, offered
        assert await _left(client, result) == []
        print(json.dumps({"harness": name, "steps": result.steps, "calls": len(calls),
                          "samples": len(result.samples), "tools": offered,
                          "phases": result.detail["phases"]}))  # fmt: skip

    rollout_stack.run(body)
