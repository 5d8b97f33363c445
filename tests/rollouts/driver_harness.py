"""A driver-side harness: the agent loop runs in the test's process.

It calls the session's ``openai_base_url`` (the host's) with the real ``openai`` client and
runs the model's ``bash`` tool calls in the sandbox through the SDK: the shape of the recipes'
built-in loops, small enough to read in one go. It keeps the history as the model produced
it (the assistant turn sent back unchanged), so the proxy's samples stitch token-exactly.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from orchard import AsyncSandbox
from orchard.rollouts import HarnessRun, Limits, ModelEndpoint, Status, Task

BASH: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the repository; returns its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


class DriverBashHarness:
    name = "driver-bash"
    needs_tools_layer = False

    def __init__(self, stream: bool = False) -> None:
        self.stream = stream

    async def _complete(self, model: openai.AsyncOpenAI, name: str, messages: list[Any]) -> Any:
        if not self.stream:
            answer = await model.chat.completions.create(
                model=name, messages=messages, tools=[BASH]
            )
            return answer.choices[0].message
        async with model.chat.completions.stream(
            model=name, messages=messages, tools=[BASH]
        ) as stream:
            final = await stream.get_final_completion()
        return final.choices[0].message

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: ModelEndpoint, limits: Limits
    ) -> HarnessRun:
        messages: list[Any] = [
            {"role": "system", "content": "You fix bugs. Use the bash tool."},
            {"role": "user", "content": task.prompt},
        ]
        async with openai.AsyncOpenAI(
            base_url=model.openai_base_url, api_key="unused", max_retries=0
        ) as client:
            for step in range(1, limits.max_steps + 1):
                message = await self._complete(client, model.model, messages)
                turn: dict[str, Any] = {"role": "assistant", "content": message.content}
                if message.tool_calls:
                    turn["tool_calls"] = [
                        {"id": c.id, "type": "function",
                         "function": {"name": c.function.name, "arguments": c.function.arguments}}
                        for c in message.tool_calls
                    ]  # fmt: skip
                messages.append(turn)
                if not message.tool_calls:
                    return HarnessRun(Status.COMPLETED, steps=step, submission=message.content,
                                      transcript=messages)  # fmt: skip
                for call in message.tool_calls:
                    command = json.loads(call.function.arguments)["command"]
                    done = await sandbox.exec(["bash", "-c", command], cwd=task.workdir,
                                              timeout=limits.command_timeout)  # fmt: skip
                    output = (done.stdout_text + done.stderr_text)[-limits.output_tail_bytes :]
                    messages.append({"role": "tool", "tool_call_id": call.id,
                                     "content": f"exit {done.exit_code}\n{output}"})  # fmt: skip
        return HarnessRun(Status.TRUNCATED, steps=limits.max_steps, transcript=messages)


class RaisingHarness:
    """A harness that cannot start (its CLI is missing, say): it raises."""

    name = "raising"
    needs_tools_layer = False

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: ModelEndpoint, limits: Limits
    ) -> HarnessRun:
        raise RuntimeError("harness binary not found: /opt/none/bin/agent")
