"""The built-in bash agent loop against a real HTTP model server (the scripted upstream, a
policy per test) and the SDK's async sandboxes over the in-process fake (commands run as host
subprocesses in the fake sandbox's directory: no container is needed to test the loop's
logic; tests/recipes/swe/test_swe_live.py runs it in real sandboxes)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from orchard.recipes.swe import prompts
from orchard.recipes.swe.agent import AgentConfig, BashAgent, submitted, truncate

from orchard.rollouts import HarnessRun, Limits, ModelEndpoint, Status, Task
from orchard.testing import FakeOrchard
from orchard.testing.scripted_model import ScriptedUpstream, scripted_upstream
from tests.recipes.swe.policies import FIX_CALC, SENTINEL_CMD, bash, commands

CALC = "def mean(values):\n    return sum(values) / (len(values) + 1)\n"
TASK = Task(
    id="calc-1",
    prompt="mean divides by one more than the number of values",
    workdir="/testbed",
    files={"/testbed/calc/__init__.py": CALC.encode()},
)


def endpoint(url: str) -> ModelEndpoint:
    return ModelEndpoint("ses_test", "scripted", url, url, url, url)


def run_agent(
    script: Any,
    limits: Limits | None = None,
    config: AgentConfig | None = None,
    fail_runs: int = 0,
    url: str | None = None,
    delay: float = 0.0,
) -> tuple[HarnessRun, ScriptedUpstream, Path]:
    with FakeOrchard() as fake, scripted_upstream(script) as (upstream, base):
        upstream.delay_seconds = delay

        async def main() -> tuple[HarnessRun, Path]:
            async with fake.async_client() as client, BashAgent(config) as agent:
                sandbox = await client.sandboxes.create()
                for path, data in TASK.files.items():
                    await sandbox.write_file(path, data)
                if fail_runs:
                    fake.fail_next("Run", times=fail_runs)
                run = await agent.run(sandbox, TASK, endpoint(url or base), limits or Limits())
                root = fake.root(sandbox.id)
                return run, Path(root)

        run, root = asyncio.run(main())
        return run, upstream, root


def test_the_agent_fixes_the_bug_and_submits_with_the_sentinel(tmp_path: Path) -> None:
    with (
        FakeOrchard() as fake,
        scripted_upstream(commands(["cat calc/__init__.py", FIX_CALC])) as (upstream, url),
    ):

        async def main() -> tuple[HarnessRun, str]:
            async with fake.async_client() as client, BashAgent() as agent:
                sandbox = await client.sandboxes.create()
                await sandbox.write_file("/testbed/calc/__init__.py", CALC)
                run = await agent.run(sandbox, TASK, endpoint(url), Limits())
                return run, (await sandbox.read_file("/testbed/calc/__init__.py")).decode()

        run, fixed = asyncio.run(main())
    assert run.status is Status.COMPLETED and run.fault is None, run
    assert run.steps == 3 and run.detail["stop_reason"] == "submitted"
    assert "sum(values) / len(values)" in fixed
    # the model saw the system prompt, the instance prompt with the problem, one tool
    first = upstream.requests[0]
    assert first["messages"][0]["content"] == prompts.SYSTEM_PROMPT
    assert TASK.prompt in first["messages"][1]["content"]
    assert "/testbed" in first["messages"][1]["content"]
    assert [t["function"]["name"] for t in first["tools"]] == ["bash"]
    # the second call carries the first command's output as the tool's answer
    second = upstream.requests[1]["messages"]
    assert second[-1]["role"] == "tool" and second[-1]["tool_call_id"] == "c0"
    assert "<returncode>0</returncode>" in second[-1]["content"]
    assert "len(values) + 1" in second[-1]["content"]
    # the history the loop sent is the transcript it reports, call after call
    assert (
        run.transcript[: len(upstream.requests[2]["messages"])] == upstream.requests[2]["messages"]
    )
    assert run.detail["format_errors"] == 0
    timing = run.detail["timing"]
    assert len(timing["model_s"]) == len(timing["exec_s"]) == len(timing["overhead_s"]) == 3
    assert all(t >= 0 for t in timing["overhead_s"])


def test_format_errors_are_fed_back_and_counted() -> None:
    script = commands(
        [
            {"content": "I think I should look at the file."},
            {"tool_calls": [{"id": "x1", "name": "bash", "arguments": "{not json"}]},
            {"tool_calls": [{"id": "x2", "name": "python", "arguments": '{"code": "1"}'}]},
            {"tool_calls": [{"id": "x3", "name": "bash", "arguments": '{"cmd": "ls"}'}]},
        ]
    )
    run, upstream, _ = run_agent(script)
    assert run.status is Status.COMPLETED
    assert run.detail["format_errors"] == 4
    assert run.steps == 5
    after_text = upstream.requests[1]["messages"][-1]
    assert after_text["role"] == "user" and "called no tool" in after_text["content"]
    after_json = upstream.requests[2]["messages"][-1]
    assert after_json["role"] == "tool" and after_json["tool_call_id"] == "x1"
    assert "not valid JSON" in after_json["content"]
    assert "no tool 'python'" in upstream.requests[3]["messages"][-1]["content"]
    assert '"command"' in upstream.requests[4]["messages"][-1]["content"]


def test_too_many_format_errors_truncate_the_rollout() -> None:
    run, upstream, _ = run_agent(
        lambda body: {"content": "no tools today"}, config=AgentConfig(max_format_errors=3)
    )
    assert run.status is Status.TRUNCATED and run.detail["stop_reason"] == "format_errors"
    assert run.steps == 3 and len(upstream.requests) == 3 and run.fault is None


def test_the_step_limit_truncates() -> None:
    run, upstream, _ = run_agent(lambda body: bash("true"), Limits(max_steps=4))
    assert run.status is Status.TRUNCATED and run.detail["stop_reason"] == "max_steps"
    assert run.steps == 4 and len(upstream.requests) == 4


def test_the_token_limit_truncates_on_the_context_the_endpoint_reports() -> None:
    run, upstream, _ = run_agent(lambda body: bash("seq 1 200"), Limits(max_tokens=3000))
    assert run.status is Status.TRUNCATED and run.detail["stop_reason"] == "max_tokens"
    assert run.detail["context_tokens"] >= 3000
    assert run.steps == len(upstream.requests) < 50


def test_the_wall_time_limit_truncates_even_while_the_model_is_thinking() -> None:
    run, _, _ = run_agent(lambda body: bash("true"), Limits(max_seconds=1.0), delay=0.4)
    assert run.status is Status.TRUNCATED and run.detail["stop_reason"] == "max_seconds"
    assert run.detail["seconds"] < 2.5


def test_long_output_is_cut_head_and_tail_with_a_marker() -> None:
    cmd = "python3 -c \"print('A' * 5000 + 'MIDDLE' + 'Z' * 5000)\""
    run, upstream, _ = run_agent(
        commands([cmd]), Limits(output_head_bytes=100, output_tail_bytes=50)
    )
    seen = upstream.requests[1]["messages"][-1]["content"]
    assert "MIDDLE" not in seen and "A" * 100 in seen and "Z" * 49 + "\n</output>" in seen
    assert "<output truncated: 9857 bytes left out of 10007" in seen
    assert run.status is Status.COMPLETED


def test_stderr_is_merged_and_a_syntax_error_is_an_observation() -> None:
    run, upstream, _ = run_agent(commands(["echo out; echo err >&2; exit 3", "if then fi"]))
    first = upstream.requests[1]["messages"][-1]["content"]
    assert "<returncode>3</returncode>" in first and "out\nerr\n" in first
    second = upstream.requests[2]["messages"][-1]["content"]
    assert "syntax error" in second and "<returncode>2</returncode>" in second
    assert run.status is Status.COMPLETED


def test_a_command_that_times_out_is_reported_to_the_model() -> None:
    run, upstream, _ = run_agent(commands(["sleep 30"]), Limits(command_timeout=1.0))
    seen = upstream.requests[1]["messages"][-1]["content"]
    assert "timed out after 1 s" in seen
    assert run.status is Status.COMPLETED


def test_a_model_endpoint_error_aborts_and_is_never_a_task_outcome() -> None:
    run, _, _ = run_agent([bash("ls"), {"status": 500, "content": "engine died"}])
    assert run.status is Status.ABORTED and run.detail["stop_reason"] == "model_failed"
    assert "500" in str(run.fault) and "engine died" in str(run.fault)
    assert run.steps == 1


def test_transient_endpoint_answers_are_retried_with_the_same_body() -> None:
    script = [{"status": 503}, {"status": 502}, bash(SENTINEL_CMD)]
    run, upstream, _ = run_agent(script, config=AgentConfig(retry_backoff_seconds=0.01))
    assert run.status is Status.COMPLETED and run.steps == 1
    assert len(upstream.requests) == 3
    assert upstream.requests[0] == upstream.requests[1] == upstream.requests[2]


def test_an_unreachable_endpoint_aborts() -> None:
    config = AgentConfig(retry_backoff_seconds=0.01, model_retries=1)
    run, _, _ = run_agent([], config=config, url="http://127.0.0.1:9/v1")
    assert run.status is Status.ABORTED and "unreachable" in str(run.fault)
    assert run.steps == 0


def test_an_answer_that_is_not_a_chat_completion_aborts() -> None:
    bad = {"tool_calls": [{"id": "z", "name": "bash", "arguments": "{}"}]}
    run, _, _ = run_agent(commands([bad]))  # a valid one first, to show the loop ran
    assert run.status is Status.COMPLETED  # a bad argument object is the model's format error
    run, _, _ = run_agent(lambda body: {"status": 200})
    assert run.status is Status.ABORTED and "not a Chat completion" in str(run.fault)


def test_a_sandbox_failure_aborts() -> None:
    run, _, _ = run_agent(commands(["ls"]), fail_runs=1)
    assert run.status is Status.ABORTED and run.detail["stop_reason"] == "sandbox_failed"
    assert str(run.fault).startswith("sandbox: ")
    assert run.steps == 1


def test_parallel_tool_calls_run_in_order_and_each_gets_its_answer() -> None:
    both = {"tool_calls": [
        {"id": "a", "name": "bash", "arguments": json.dumps({"command": "echo one"})},
        {"id": "b", "name": "bash", "arguments": json.dumps({"command": SENTINEL_CMD})},
        {"id": "c", "name": "bash", "arguments": json.dumps({"command": "echo never"})},
    ]}  # fmt: skip
    run, _, _ = run_agent(commands([both]))
    assert run.status is Status.COMPLETED and run.steps == 1
    tools = [m for m in run.transcript if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["a", "b", "c"]
    assert "one" in tools[0]["content"] and tools[2]["content"] == "not run: submitted"


def test_truncate_and_the_sentinel() -> None:
    assert truncate(b"abcdef", 3, 3) == "abcdef"
    cut = truncate(b"0123456789", 2, 3)
    assert cut.startswith("01\n<output truncated: 5 bytes left out of 10") and cut.endswith("\n789")
    assert truncate(b"\xff\xfe" * 4, 100, 100) == "\ufffd" * 8
    assert submitted(b"\n  COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\ndiff --git")
    assert not submitted(b"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    assert not submitted(b"x\nCOMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


@pytest.mark.parametrize("command", ["", "   ", "a\x00b"])
def test_empty_or_binary_commands_are_format_errors(command: str) -> None:
    run, _, _ = run_agent(commands([bash(command)]))
    assert run.detail["format_errors"] == 1 and run.status is Status.COMPLETED


def test_calls_of_one_reply_stop_at_the_wall_time() -> None:
    many = {"tool_calls": [
        {"id": f"s{i}", "name": "bash", "arguments": json.dumps({"command": "sleep 0.6"})}
        for i in range(6)
    ]}  # fmt: skip
    run, _, _ = run_agent(commands([many]), Limits(max_seconds=1.0))
    assert run.status is Status.TRUNCATED and run.detail["stop_reason"] == "max_seconds"
    tools = [m for m in run.transcript if m["role"] == "tool"]
    assert len(tools) == 6 and tools[-1]["content"] == "not run: time is up"
    assert run.detail["seconds"] < 2.5
