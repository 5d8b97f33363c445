"""An Inspect task that names its sandbox only as the string "orchard": it imports
nothing of orchard (the provider comes from our ``inspect_ai`` entry point).

The model is Inspect's ``mockllm/model`` scripted to answer each question
with a Python program (``print(<expression>)``; its usage is given, so Inspect
counts no tokens: tiktoken would download its tables). The scorer runs the
model's program in the sample's sandbox and compares what it prints with the
target. Sample "six" has its own config (a YAML file: memory and env); the
others use the task's default.
"""

from __future__ import annotations

from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessage, ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer
from inspect_ai.solver import TaskState, generate
from inspect_ai.util import sandbox

SMALL = Path(__file__).with_name("inspect_orchard_small.yaml")


def write_a_program(input: list[ChatMessage], *_: object) -> ModelOutput:
    output = ModelOutput.from_content("mockllm/model", f"print({input[-1].text})")
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


@scorer(metrics=[accuracy()])
def runs_in_sandbox(count_live: bool = False):  # type: ignore[no-untyped-def]
    async def score(state: TaskState, target: Target) -> Score:
        await sandbox().write_file("answer.py", state.output.completion)
        result = await sandbox().exec(["python3", "answer.py"], timeout=30)
        probe = await sandbox().exec(["sh", "-c", "echo ${N:-unset}"])
        metadata: dict[str, object] = {"N": probe.stdout.strip()}
        if count_live:  # the in-process test only: this sandbox's memory, and how many exist now
            from orchard import AsyncOrchard
            from orchard.integrations.inspect import OrchardSandboxEnvironment

            info = await sandbox().as_type(OrchardSandboxEnvironment).sandbox.info()
            metadata["memory"] = info.memory_bytes
            async with AsyncOrchard() as client:
                infos = await client.sandboxes.list({"inspect-ai/task": "arithmetic_in_sandbox"})
            metadata["live"] = sum(i.state in ("ready", "claimed", "pending") for i in infos)
        answer = result.stdout.strip()
        return Score(
            value=CORRECT if answer == target.text else INCORRECT, answer=answer, metadata=metadata
        )

    return score


@task
def arithmetic_in_sandbox(count_live: bool = False) -> Task:
    return Task(
        dataset=[
            Sample(id="six", input="6*7", target="42", sandbox=("orchard", str(SMALL))),
            Sample(id="three", input="3*7", target="21"),
            Sample(id="wrong", input="2*2", target="5"),
        ],
        solver=generate(),
        scorer=runs_in_sandbox(count_live),
        sandbox="orchard",
        model=get_model("mockllm/model", custom_outputs=write_a_program),
    )
