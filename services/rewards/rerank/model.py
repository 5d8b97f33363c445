"""The value model: L2-regularised logistic regression on the features, in numpy.

Small, deterministic and CPU-only: it trains on a few thousand rollouts in
seconds. ``save``/``load`` use one ``.npz`` (weights, bias, standardisation,
featurizer name). The production path (fine-tuning a Hugging Face
sequence-classification model) is in ``hf_finetune.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .features import Featurizer, Vector, make_featurizer
from .store import Rollout


def _sigmoid(z: Vector) -> Vector:
    out: Vector = 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))
    return out


@dataclass
class ValueModel:
    featurizer: Featurizer
    weights: Vector
    bias: float
    mean: Vector
    scale: Vector

    @classmethod
    def train(
        cls,
        rollouts: Sequence[Rollout],
        featurizer: Featurizer | None = None,
        l2: float = 5e-2,
        epochs: int = 300,
        learning_rate: float = 0.5,
    ) -> ValueModel:
        if not rollouts:
            raise ValueError("no rollouts to train on")
        featurizer = featurizer or make_featurizer("hashing")
        x = featurizer.transform(rollouts)
        y = np.array([1.0 if r.resolved else 0.0 for r in rollouts])
        # Standardise only dense columns: scaling sparse hashed counts by their tiny
        # std would blow rare n-grams up into the strongest features.
        dense = x.std(axis=0) > 0.05
        mean = np.where(dense, x.mean(axis=0), 0.0)
        scale = np.where(dense, x.std(axis=0) + 1e-6, 1.0)
        x = (x - mean) / scale
        weights, bias = (
            np.zeros(x.shape[1]),
            float(np.log((y.mean() + 1e-3) / (1 - y.mean() + 1e-3))),
        )
        positive = max(y.mean(), 1e-3)
        sample_weight = np.where(
            y == 1, 0.5 / positive, 0.5 / max(1 - positive, 1e-3)
        )  # balance classes
        for _ in range(epochs):
            p = _sigmoid(x @ weights + bias)
            error = (p - y) * sample_weight
            weights -= learning_rate * (x.T @ error / len(y) + l2 * weights)
            bias -= learning_rate * float(error.mean())
        return cls(featurizer, weights, bias, mean, scale)

    def predict(self, rollouts: Sequence[Rollout]) -> Vector:
        """P(resolved) for each rollout."""
        if not rollouts:
            return np.zeros(0)
        x = (self.featurizer.transform(rollouts) - self.mean) / self.scale
        return _sigmoid(x @ self.weights + self.bias)

    def rank(self, rollouts: Sequence[Rollout]) -> list[tuple[int, float]]:
        """(index, score) best first."""
        scores = self.predict(rollouts)
        order = sorted(range(len(rollouts)), key=lambda i: -scores[i])
        return [(i, float(scores[i])) for i in order]

    def save(self, path: Path) -> None:
        np.savez_compressed(
            path, weights=self.weights, bias=np.array([self.bias]), mean=self.mean,
            scale=self.scale, meta=np.array([json.dumps({"featurizer": self.featurizer.name})]),
        )  # fmt: skip

    @classmethod
    def load(cls, path: Path) -> ValueModel:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"][0]))
            return cls(
                make_featurizer(meta["featurizer"]), data["weights"], float(data["bias"][0]),
                data["mean"], data["scale"],
            )  # fmt: skip
