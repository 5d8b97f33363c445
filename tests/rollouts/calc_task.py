"""The sample SWE task (recipes/swe/samples/calc_divide) as a rollout Task, its grader, and
the checks the rollout tests share: the repository ends fixed, the diff is the fix, and the
recorded samples are token-exact against what the scripted model server produced.

The Task is built here from the sample's files (the SWE recipe's own loader is another
helper's); setup makes the folder a git repository with one commit, so the runner's diff is
the agent's change. ``__pycache__`` is excluded (pytest writes it; it is not the agent's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchard import AsyncSandbox
from orchard.rollouts import HarnessRun, RolloutResult, Task
from orchard.testing.scripted_model import completion_text, logprob_of, prompt_ids, tokens

SAMPLE = Path(__file__).resolve().parents[2] / "recipes" / "swe" / "samples" / "calc_divide"
WORKDIR = "/testbed"

SETUP = (
    "git init -q . && printf '__pycache__/\\n' >> .git/info/exclude"
    " && git add -A && git -c user.name=task -c user.email=task@orchard.invalid"
    " commit -qm 'the task as given'"
)


def calc_task(task_id: str = "calc_divide", image: str | None = None) -> Task:
    repo = SAMPLE / "repo"
    files = {
        f"{WORKDIR}/{p.relative_to(repo)}": p.read_bytes()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }
    return Task(
        id=task_id, prompt=(SAMPLE / "problem.md").read_text(), image=image, workdir=WORKDIR,
        files=files, setup=(SETUP,), metadata={"sample": "calc_divide"},
    )  # fmt: skip


async def grade_hidden_tests(sandbox: AsyncSandbox, task: Task, run: HarnessRun) -> float:
    """The SWE way: apply the task's hidden tests (test.patch), run them; 1.0 if they pass."""
    await sandbox.write_file("/tmp/test.patch", (SAMPLE / "test.patch").read_bytes())
    applied = await sandbox.exec(["git", "apply", "/tmp/test.patch"], cwd=task.workdir)
    assert applied.exit_code == 0, applied.stderr_text
    done = await sandbox.exec(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                              cwd=task.workdir, timeout=120)  # fmt: skip
    return 1.0 if done.exit_code == 0 else 0.0


def without_index_lines(diff: str) -> str:
    return "".join(line for line in diff.splitlines(True) if not line.startswith("index "))


def gold_patch() -> str:
    return (SAMPLE / "gold.patch").read_text()


def assert_token_exact(
    result: RolloutResult, answered: list[tuple[dict[str, Any], dict[str, Any]]]
) -> None:
    """``answered``: (the Chat body the scripted server got, the entry it answered with) for
    each call of this rollout, in order. One branch, one sample: its tokens are the last
    call's prompt + completion as the server tokenised them, the loss mask is 1 exactly on
    every call's completion, the logprobs are the server's there and 0.0 elsewhere, the
    prompt is the first call's."""
    assert len(result.samples) == 1, [s.get("root") for s in result.samples]
    sample = result.samples[0]
    assert sample["token_exact"] is True, sample.get("not_token_exact")
    assert sample["calls"] == list(range(len(answered)))
    last_body, last_entry = answered[-1]
    expected = prompt_ids(last_body["messages"]) + tokens(completion_text(last_entry))
    assert sample["tokens"] == expected
    mask = [0] * len(expected)
    for body, entry in answered:
        start = len(prompt_ids(body["messages"]))
        completion = tokens(completion_text(entry))
        assert expected[start : start + len(completion)] == completion
        mask[start : start + len(completion)] = [1] * len(completion)
    assert sample["loss_mask"] == mask
    assert sample["logprobs"] == [
        logprob_of(t) if m else 0.0 for t, m in zip(expected, mask, strict=True)
    ]
    assert sample["prompt_length"] == len(prompt_ids(answered[0][0]["messages"]))


def assert_samples_token_exact(
    result: RolloutResult,
    calls: list[dict[str, Any]],
    answered: list[tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """The general check, for harnesses that may branch (rewrite history, side calls): every
    recorded call is matched to the upstream body it sent and the entry the server answered
    with, and every sample's tokens are its leaf call's prompt + completion as the server
    tokenised them, its loss mask 1 exactly on its branch's completions, its logprobs the
    server's there."""
    entries = {json.dumps(b["messages"], sort_keys=True): e for b, e in answered}
    by_call: dict[int, tuple[list[int], list[int]]] = {}
    for call in calls:
        if call["status"] != 200:
            continue
        messages = call["upstream_request"]["messages"]
        entry = entries[json.dumps(messages, sort_keys=True)]
        by_call[call["index"]] = (prompt_ids(messages), tokens(completion_text(entry)))
        assert call["prompt_token_ids"] == by_call[call["index"]][0]
        assert call["completion_token_ids"] == by_call[call["index"]][1]
    assert result.samples, "no samples"
    covered: set[int] = set()
    for sample in result.samples:
        assert sample["token_exact"] is True, sample.get("not_token_exact")
        prompt, completion = by_call[sample["calls"][-1]]
        expected = prompt + completion
        assert sample["tokens"] == expected
        mask = [0] * len(expected)
        for index in sample["calls"]:
            p, c = by_call[index]
            assert expected[len(p) : len(p) + len(c)] == c, index
            mask[len(p) : len(p) + len(c)] = [1] * len(c)
            covered.add(index)
        assert sample["loss_mask"] == mask
        assert sample["logprobs"] == [
            logprob_of(t) if m else 0.0 for t, m in zip(expected, mask, strict=True)
        ]
    assert covered == set(by_call)  # every answered call is in some sample
