"""The recorded samples train: one SFT step and GRPO steps with TRL on the CPU, on a tiny
randomly initialised Llama built here, fed by samples the real recording proxy made from a
scripted upstream (its tokens are code points: the vocabulary covers them), and the CA-SFT
token form. Loss finite and changing, weights moved. Needs the ``swe-train`` extra (torch's
CPU build, transformers, TRL): ``make swe-train-deps``, which ``make test`` runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from orchard.recipes.swe import casft
from orchard.recipes.swe.seams import trl as seam
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, SFTConfig, SFTTrainer

from .proxy_samples import Turn, recording_proxy, run_session

# TRL 1.16 on transformers 5.24 warns about its own defaults (deprecated aliases it sets itself)
pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning:transformers.*"),
    pytest.mark.filterwarnings("ignore::UserWarning:trl.*"),
]

VOCAB = 512  # the scripted tokenizer's ids are code points; the scripts below are ASCII
TASK = "fix divide"
RUNS = [  # four rollouts of one task, two solved: a group with reward variance
    ([Turn("python -m pytest -q", "1 failed"), Turn("apply fix", "ok")], 1.0),
    ([Turn("ls", "calc tests")], -1.0),
    (
        [Turn("cat calc/__init__.py", "def divide(a, b): return a / b"), Turn("apply fix", "ok")],
        1.0,
    ),
    ([Turn("rm -rf tests", "")], -1.0),
]


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    home = tmp_path_factory.mktemp("proxy")
    out = []
    for i, (turns, reward) in enumerate(RUNS):  # a proxy per rollout: its script is the rollout's
        (home / str(i)).mkdir()
        with recording_proxy(home / str(i), {TASK: turns}) as proxy:
            out.append(run_session(proxy, TASK, turns, reward))
    return [[s for found in out for s in found]]


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {chr(i): i for i in range(VOCAB)}
    tok = Tokenizer(WordLevel(vocab, unk_token=chr(1)))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=chr(0), eos_token=chr(3), unk_token=chr(1)
    )


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         pad_token_id=0, eos_token_id=3, bos_token_id=2)  # fmt: skip
    return LlamaForCausalLM(config)


def _weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def _losses(trainer: Any) -> list[float]:
    return [float(e["loss"]) for e in trainer.state.log_history if "loss" in e]


def test_one_sft_step_on_recorded_samples(
    groups: list[list[dict[str, Any]]], tmp_path: Path
) -> None:
    samples = groups[0]
    assert all(s["token_exact"] and max(s["tokens"]) < VOCAB for s in samples)
    rows = [seam.sft_row(s) for s in samples]
    model, before = tiny_model(), None
    before = _weights(model)
    args = SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, learning_rate=1e-2,
                     logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", max_length=None,
                     dataloader_num_workers=0, seed=0)  # fmt: skip
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer())  # fmt: skip
    # the labels TRL built are the model's own tokens only: -100 on prompts and tool results
    first = trainer.train_dataset[0]
    assert [
        t if m else -100
        for t, m in zip(rows[0]["input_ids"], rows[0]["assistant_masks"], strict=True)
    ] == first["labels"]
    trainer.train()
    losses = _losses(trainer)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses) and losses[0] != losses[1]
    assert not torch.equal(before, _weights(model))


class FixedTeacher:
    """An in-process stand-in for the judge (test_casft.py drives the real service): the
    second step of the failed rollout is the mistake."""

    async def judge(self, template: str, inputs: dict[str, str]) -> Any:
        n = int(inputs["step_count"])
        values = [0.6] + [0.1] * (n - 1)
        return type(
            "Verdict",
            (),
            {
                "ok": True,
                "failure": "",
                "data": {"reasoning": "", "p_start": 0.5, "p_success": values},
            },
        )()


def test_casft_token_form_trains_only_the_steps_before_the_mistake(
    groups: list[list[dict[str, Any]]], tmp_path: Path
) -> None:
    import asyncio

    failed = groups[0][1]  # the rollout that listed files and gave up: reward -1
    record = asyncio.run(casft.record(failed, TASK, FixedTeacher()))
    assert isinstance(record, dict) and record["trained_steps"] == [0]
    row = seam.sft_row(record)
    assert 0 < sum(row["assistant_masks"]) < sum(failed["loss_mask"])
    args = SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=1, learning_rate=1e-2,
                     logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", max_length=None,
                     dataloader_num_workers=0, seed=0)  # fmt: skip
    trainer = SFTTrainer(model=tiny_model(), args=args, train_dataset=Dataset.from_list([row]),
                         processing_class=tokenizer())  # fmt: skip
    labels = trainer.train_dataset[0]["labels"]
    assert sum(t != -100 for t in labels) == sum(row["assistant_masks"])
    trainer.train()
    losses = _losses(trainer)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses) and losses[0] != losses[1]


def test_grpo_steps_on_recorded_groups(groups: list[list[dict[str, Any]]], tmp_path: Path) -> None:
    batch = seam.grpo_batch(groups, pad_id=0)
    assert batch["advantages"].tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-3)
    # tool results are attended (completion_mask) but not learnt (tool_mask)
    assert (batch["tool_mask"] <= batch["completion_mask"]).all() and batch[
        "tool_mask"
    ].sum() < batch["completion_mask"].sum()
    assert "old_per_token_logps" in batch
    trainer_class = seam.recorded_grpo_trainer(iter([batch, batch]))
    model = tiny_model()
    before = _weights(model)
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, num_generations=4,
                      learning_rate=1e-2, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                      beta=0.0, seed=0, dataloader_num_workers=0)  # fmt: skip
    prompts = Dataset.from_list([{"prompt": TASK}] * 8)

    def unused(**kwargs: Any) -> list[float]:
        raise AssertionError("the recorded rewards are used, not a reward function")

    trainer = trainer_class(model=model, reward_funcs=[unused], args=args, train_dataset=prompts,
                            processing_class=tokenizer())  # fmt: skip
    trainer.train()
    losses = _losses(trainer)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses) and losses[0] != losses[1]
    assert not torch.equal(before, _weights(model))
