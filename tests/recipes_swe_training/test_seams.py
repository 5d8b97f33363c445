"""The trainer seams on recorded proxy samples: verl's real ``AgentLoopBase`` / ``AgentLoopOutput``
(verl 0.9.1 installed without its training stack), TRL's real ``GRPOTrainer`` accepting the
environment (on the SDK's in-process fake of Orchard: the commands are scripted), SkyRL's
``GeneratorOutput`` as its installed source declares it, and slime's protocol on a stand-in
``Sample`` with the fields of slime's own (git-only, not installable here)."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from omegaconf import OmegaConf
from orchard.recipes.swe.seams import common, skyrl, slime, trl, verl
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen3_chat_template

from orchard.rollouts import RolloutResult, Status, Task
from orchard.testing import FakeOrchard, ScriptedResult

from .proxy_samples import Turn, recording_proxy, run_session
from .test_trl_training import tiny_model, tokenizer

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning:transformers.*"),
    pytest.mark.filterwarnings("ignore::UserWarning:trl.*"),
    pytest.mark.filterwarnings("ignore:You are using 'environment_factory':UserWarning"),
    pytest.mark.filterwarnings("ignore:Ray state API is no longer experimental:DeprecationWarning"),
]
TASK = Task("calc-1", "fix divide", image="python:3.12")
TURNS = [Turn("python -m pytest -q", "1 failed"), Turn("apply fix", "ok")]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    with recording_proxy(tmp_path_factory.mktemp("proxy"), {TASK.prompt: TURNS}) as proxy:
        return run_session(proxy, TASK.prompt, TURNS, 1.0)


def _result(
    samples: list[dict[str, Any]], status: Status = Status.COMPLETED, reward: float | None = 1.0
) -> RolloutResult:
    return RolloutResult(TASK.id, "scripted", status, 3, "diff --git a/x b/x", None,
                         [dict(s) for s in samples], "ses_1", reward=reward, fault=None if reward is not None else "sandbox lost")  # fmt: skip


def test_split_at_the_prompt(recorded: list[dict[str, Any]]) -> None:
    (sample,) = recorded
    part = common.split(sample)
    n = sample["prompt_length"]
    assert part.prompt_ids + part.response_ids == sample["tokens"] and len(part.prompt_ids) == n
    assert (
        part.response_mask == sample["loss_mask"][n:]
        and 0 in part.response_mask
        and 1 in part.response_mask
    )
    assert part.response_logprobs == sample["logprobs"][n:] and part.reward == 1.0
    with pytest.raises(common.SampleError, match="not token-exact"):
        common.split({**sample, "token_exact": False, "tokens": None})
    with pytest.raises(common.SampleError, match="inside the prompt"):
        common.split({**sample, "loss_mask": [1, *sample["loss_mask"][1:]]})


# --- verl ------------------------------------------------------------------------------


def _verl_loop(draw: Any) -> Any:
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 4096}}})
    cls = verl.OrchardSweAgentLoop
    return cls(DictConfigWrap(config), None, tokenizer(), None, None, DictConfigWrap(OmegaConf.create({})),
               draw=draw, task_of=lambda row: Task(row["task_id"], row["prompt"]))  # fmt: skip


def test_verl_agent_loop_answers_its_output(recorded: list[dict[str, Any]]) -> None:
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopOutput,
        _agent_loop_registry,
    )

    seen: list[Task] = []

    async def draw(task: Task) -> RolloutResult:
        seen.append(task)
        return _result(recorded)

    async def go() -> Any:  # verl's loop takes the running event loop when it is made
        loop = _verl_loop(draw)
        assert isinstance(loop, AgentLoopBase)
        return await loop.run({"temperature": 1.0}, task_id="calc-1", prompt="fix divide")

    out = asyncio.run(go())
    assert isinstance(out, AgentLoopOutput) and seen == [Task("calc-1", "fix divide")]
    n = recorded[0]["prompt_length"]
    assert (
        out.prompt_ids == recorded[0]["tokens"][:n]
        and out.response_ids == recorded[0]["tokens"][n:]
    )
    assert out.response_mask == recorded[0]["loss_mask"][n:] and out.reward_score == 1.0
    assert out.extra_fields["orchard"]["session_id"] == "ses_1" and out.num_turns == len(
        recorded[0]["messages"]
    )
    verl.register("orchard_swe_test")
    assert _agent_loop_registry["orchard_swe_test"] == {
        "_target_": "orchard.recipes.swe.seams.verl.OrchardSweAgentLoop"
    }


def test_verl_retries_an_aborted_rollout_then_says_why(recorded: list[dict[str, Any]]) -> None:
    answers = [_result([], Status.ABORTED, None), _result(recorded)]

    async def draw(task: Task) -> RolloutResult:
        return answers.pop(0)

    async def run(draw: Any) -> Any:
        return await _verl_loop(draw).run({}, task_id="t", prompt="p")

    assert asyncio.run(run(draw)).reward_score == 1.0

    async def always_aborted(task: Task) -> RolloutResult:
        return _result([], Status.ABORTED, None)

    with pytest.raises(common.SampleError, match=r"aborted 3 times.*sandbox lost"):
        asyncio.run(run(always_aborted))


# --- SkyRL -----------------------------------------------------------------------------


def _declared_generator_output() -> dict[str, str]:
    """The keys of ``GeneratorOutput`` as the installed skyrl declares them (its source: the
    ``name: annotation`` lines of the TypedDict's body; ``ast`` trips CPython 3.11.7's
    recursion-depth check after torch is loaded)."""
    spec = importlib.util.find_spec("skyrl")
    assert spec is not None and spec.submodule_search_locations, (
        "skyrl is not installed (make swe-train-deps)"
    )
    source = Path(next(iter(spec.submodule_search_locations))) / "train" / "generators" / "base.py"
    body = source.read_text().split("class GeneratorOutput(TypedDict):\n", 1)[1]
    body = re.split(r"\n(?=\S)", body, maxsplit=1)[0]
    return dict(re.findall(r"^    (\w+): (.+)$", body, flags=re.MULTILINE))


def test_skyrl_generator_output_matches_its_declaration(recorded: list[dict[str, Any]]) -> None:
    declared = _declared_generator_output()
    ok = _result(recorded)
    out = skyrl.generator_output([ok, ok], ["a_0", "a_1"])
    required = {k for k, v in declared.items() if not v.startswith("Optional")}
    assert required == {"prompt_token_ids", "response_ids", "rewards", "loss_masks"}
    assert required <= set(out) <= set(declared)
    n = recorded[0]["prompt_length"]
    assert out["prompt_token_ids"][0] == recorded[0]["tokens"][:n] and out["rewards"] == [1.0, 1.0]
    assert out["loss_masks"][0] == recorded[0]["loss_mask"][n:] and out["stop_reasons"] == [
        "stop",
        "stop",
    ]
    assert (
        len(out["response_ids"][0]) == len(out["loss_masks"][0]) == len(out["rollout_logprobs"][0])
    )


def test_skyrl_masks_the_whole_group_of_an_aborted_rollout(recorded: list[dict[str, Any]]) -> None:
    @dataclasses.dataclass
    class TrajectoryID:  # skyrl's: instance_id + repetition_id
        instance_id: str
        repetition_id: int

    ok, lost = _result(recorded), _result([], Status.ABORTED, None)
    ids = [TrajectoryID("a", 0), TrajectoryID("a", 1), TrajectoryID("b", 0), TrajectoryID("b", 1)]
    out = skyrl.generator_output([ok, lost, ok, ok], ids)
    assert out["rewards"] == [0.0, 0.0, 1.0, 1.0] and out["stop_reasons"] == [
        "stop",
        "aborted",
        "stop",
        "stop",
    ]
    assert (
        not any(out["loss_masks"][0])
        and not any(out["loss_masks"][1])
        and any(out["loss_masks"][2])
    )
    assert out["rollout_metrics"]["orchard/masked_groups"] == 1
    with pytest.raises(common.SampleError, match=r"no trajectory ids.*sandbox lost"):
        skyrl.generator_output([ok, lost])


# --- slime -----------------------------------------------------------------------------


@dataclass
class SlimeSample:
    """The fields of ``slime.utils.types.Sample`` these hooks touch (THUDM/slime, read at
    commit 0d234f3e), with its ``Status`` enum."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)


def test_slime_generate_fills_the_sample(recorded: list[dict[str, Any]]) -> None:
    async def draw(task: Task) -> RolloutResult:
        return _result(recorded)

    generate = slime.make_generate(draw, lambda s: Task(s.metadata["task_id"], s.prompt))
    sample = SlimeSample(
        group_index=0, index=3, prompt="fix divide", metadata={"task_id": "calc-1"}
    )
    out = asyncio.run(generate(None, sample, {"temperature": 1.0}))
    n = recorded[0]["prompt_length"]
    assert out is sample and sample.status is SlimeSample.Status.COMPLETED
    assert (
        sample.tokens == recorded[0]["tokens"]
        and sample.response_length == len(recorded[0]["tokens"]) - n
    )
    assert (
        sample.loss_mask == recorded[0]["loss_mask"][n:]
        and len(sample.rollout_log_probs or []) == sample.response_length
    )
    assert asyncio.run(slime.reward(None, sample)) == 1.0
    assert {f.name for f in dataclasses.fields(SlimeSample)} >= {
        "tokens",
        "response_length",
        "loss_mask",
    }


def test_slime_aborted_rollout_is_removed_not_scored() -> None:
    async def draw(task: Task) -> RolloutResult:
        return _result([], Status.ABORTED, None)

    sample = SlimeSample(index=1, prompt="p")
    asyncio.run(slime.make_generate(draw, lambda s: Task("t", s.prompt))(None, sample, {}))
    assert (
        sample.status is SlimeSample.Status.ABORTED
        and sample.remove_sample
        and sample.reward is None
    )
    with pytest.raises(common.SampleError, match="no reward"):
        asyncio.run(slime.reward(None, sample))


def test_slime_bar_filter_keeps_groups_with_signal() -> None:
    def group(*rewards: float | None) -> list[SlimeSample]:
        return [SlimeSample(reward=r, status=SlimeSample.Status.ABORTED if r is None else SlimeSample.Status.COMPLETED)
                for r in rewards]  # fmt: skip

    keep = slime.bar_filter(None, group(1.0, -1.0, -1.0, 1.0))
    assert keep.keep and keep.reason is None
    assert (slime.bar_filter(None, group(1.0, 1.0, 1.0, 1.0)).reason) == "bar_all_success"
    assert (slime.bar_filter(None, group(-1.0, -1.0, -1.0, -1.0)).reason) == "bar_all_failure"
    assert (slime.bar_filter(None, group(-1.0, None, -1.0, -1.0)).reason) == "bar_aborted"
    assert (
        slime.bar_filter(None, group(1.0, -1.0, None, None)).reason == "bar_aborted"
    )  # no reward-less member
    narrow = type("Args", (), {"bar_pmin": 0.375, "bar_pmax": 0.625})()
    assert slime.bar_filter(narrow, group(1.0, -1.0, -1.0, -1.0)).reason == "bar_unbalanced"


# --- TRL environment_factory -------------------------------------------------------------


def test_trl_environment_runs_the_task_in_a_sandbox_and_grades_its_diff(tmp_path: Path) -> None:
    graded: list[tuple[str, str]] = []

    def grade(task: Task, diff: str) -> float:
        graded.append((task.id, diff))
        return 1.0 if "raise" in diff else -1.0

    with FakeOrchard(run_commands=False) as fake, fake.client() as client:
        fake.on_exec("python -m pytest -q", ScriptedResult(stdout="1 failed\n", exit_code=1))
        fake.on_exec(
            "git diff", ScriptedResult(stdout="+    raise ZeroDivisionError\n", exit_code=0)
        )
        fake.on_exec("git init -q", ScriptedResult(exit_code=0))
        task = Task("calc-1", "fix divide", files={"/testbed/calc.py": b"def divide(a, b): return a / b\n"},
                    setup=["git init -q"])  # fmt: skip
        make = trl.environment_factory(client, lambda row: task, grade)
        env = make()
        assert env.reset(task_id="calc-1", prompt="fix divide") is None
        assert env.bash("python -m pytest -q") == "exit code 1\n1 failed\n"
        assert env.get_reward() == 1.0 and graded == [("calc-1", "+    raise ZeroDivisionError\n")]
        assert client.sandboxes.list() == []  # the rollout's sandbox is gone once graded
        assert env.bash("ls") == "error: the environment was not reset"

        # TRL's own trainer accepts it: probes one instance, reads the bash tool's schema
        tok = tokenizer()
        tok.chat_template = qwen3_chat_template  # one TRL knows how to parse tool calls from
        args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                          report_to=[], use_cpu=True, save_strategy="no", max_completion_length=8)  # fmt: skip

        trainer = GRPOTrainer(model=tiny_model(), args=args, processing_class=tok, environment_factory=make,
                              train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "fix divide"}]}] * 2))  # fmt: skip
        assert [t.__name__ for t in trainer.tools] == ["bash"]
        assert trainer.reward_func_names == ["SweEnvironment"]
