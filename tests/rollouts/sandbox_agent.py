"""An in-sandbox harness without the tools layer: a small agent loop in the image's own
python3 (standard library only), run inside a sandbox with network ``none``; it reaches the
model only through the sandbox's model endpoint (``OPENAI_BASE_URL`` = the session's
in-sandbox URL) and runs the model's ``bash`` calls as its own subprocesses. Its transcript is
what it prints. The runner's in-sandbox path (model endpoint, ``*_in_sandbox`` URLs), tested
before and apart from the real harness CLIs."""

from __future__ import annotations

import json

from orchard import AsyncSandbox
from orchard.rollouts import HarnessRun, Limits, ModelEndpoint, Status, Task

AGENT = r"""
import json, os, subprocess, sys, urllib.request

base, model, max_steps = os.environ["OPENAI_BASE_URL"], os.environ["MODEL"], int(sys.argv[1])
tools = [{"type": "function", "function": {"name": "bash", "description": "run a command",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                         "required": ["command"]}}}]
messages = [{"role": "system", "content": "You fix bugs. Use the bash tool."},
            {"role": "user", "content": open(sys.argv[2]).read()}]
for step in range(1, max_steps + 1):
    body = json.dumps({"model": model, "messages": messages, "tools": tools}).encode()
    request = urllib.request.Request(base + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        message = json.loads(answer.read())["choices"][0]["message"]
    turn = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        turn["tool_calls"] = message["tool_calls"]
    messages.append(turn)
    if not message.get("tool_calls"):
        print(json.dumps({"status": "completed", "steps": step, "messages": messages}))
        sys.exit(0)
    for call in message["tool_calls"]:
        command = json.loads(call["function"]["arguments"])["command"]
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": f"exit {done.returncode}\n{done.stdout + done.stderr}"})
print(json.dumps({"status": "truncated", "steps": max_steps, "messages": messages}))
"""


class InSandboxAgent:
    name = "in-sandbox-python"
    needs_tools_layer = False
    runs_in_sandbox = True

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: ModelEndpoint, limits: Limits
    ) -> HarnessRun:
        await sandbox.write_file("/opt/agent/agent.py", AGENT)
        await sandbox.write_file("/opt/agent/prompt.txt", task.prompt)
        done = await sandbox.exec(
            ["python3", "/opt/agent/agent.py", str(limits.max_steps), "/opt/agent/prompt.txt"],
            cwd=task.workdir, timeout=limits.max_seconds,
            env={"OPENAI_BASE_URL": model.openai_base_url_in_sandbox, "MODEL": model.model},
        )  # fmt: skip
        if done.exit_code != 0:
            return HarnessRun(Status.ABORTED, fault=f"agent exited {done.exit_code}: "
                              f"{done.stderr_text[-1000:]}")  # fmt: skip
        report = json.loads(done.stdout)
        status = Status.COMPLETED if report["status"] == "completed" else Status.TRUNCATED
        messages = report["messages"]
        return HarnessRun(status, steps=report["steps"], transcript=messages,
                          submission=messages[-1].get("content"))  # fmt: skip
