"""The production path: fine-tune a Hugging Face sequence-classification model as the value model.

Input text = task + compact trajectory + patch (the same rendering the CPU
model uses), label = resolved. Any ``AutoModelForSequenceClassification``
checkpoint works (the original used a 4B model; give it a GPU). Needs the
``rewards-ml`` extra (torch, transformers); nothing here runs in ``make test``
unless those are installed. The model path must be local (no hub download).

    python -m orchard.rewards.rerank finetune STORE.jsonl --base /models/qwen3-4b --out DIR
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .features import rollout_text
from .store import Rollout


def example_text(rollout: Rollout, max_patch_chars: int = 6000) -> str:
    return f"TASK:\n{rollout.task}\n\nTRAJECTORY:\n{rollout_text(rollout)}\n\nPATCH:\n{rollout.patch[:max_patch_chars]}"


def finetune(
    rollouts: Sequence[Rollout],
    base_model: str,
    out_dir: Path,
    epochs: int = 1,
    batch_size: int = 8,
    learning_rate: float = 2e-5,
    max_length: int = 2048,
) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(base_model, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(
        base_model, num_labels=1, local_files_only=True
    ).to(device)
    model.config.pad_token_id = tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    texts = [example_text(r) for r in rollouts]
    labels = torch.tensor([1.0 if r.resolved else 0.0 for r in rollouts])
    model.train()
    steps, last_loss = 0, 0.0
    for _ in range(epochs):
        order = torch.randperm(len(texts))
        for start in range(0, len(texts), batch_size):
            index = order[start : start + batch_size]
            batch = tokenizer(
                [texts[i] for i in index], truncation=True, max_length=max_length,
                padding=True, return_tensors="pt",
            ).to(device)  # fmt: skip
            logits = model(**batch).logits.squeeze(-1)
            loss = loss_fn(logits, labels[index].to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps, last_loss = steps + 1, float(loss)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"steps": steps, "last_loss": last_loss, "device": device, "out": str(out_dir)}


def score_with(model_dir: Path, rollouts: Sequence[Rollout], max_length: int = 2048) -> list[float]:
    """P(resolved) from a fine-tuned checkpoint."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True)
    model.eval()
    scores: list[float] = []
    with torch.no_grad():
        for rollout in rollouts:
            batch = tokenizer(
                example_text(rollout), truncation=True, max_length=max_length, return_tensors="pt"
            )
            scores.append(float(torch.sigmoid(model(**batch).logits.squeeze())))
    return scores
