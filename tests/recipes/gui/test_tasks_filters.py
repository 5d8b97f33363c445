"""The WebGym-style loader and the five-stage filter, on rows written for the purpose
(``fixtures/``: live-web tasks cannot run here). The semantic stage here uses a word-count
embedder so the pipeline's bookkeeping is tested alone; the real MiniLM stage is
``test_dedup_minilm.py``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from orchard.recipes.gui import filters as f
from orchard.recipes.gui.tasks import GuiTask, load_tasks, miniwob_task, site_of
from orchard.recipes.swe.tasks import TaskRowError

FIXTURES = Path(__file__).parent / "fixtures"
TRAIN = FIXTURES / "webgym_train.jsonl"
EVAL = FIXTURES / "webgym_eval.jsonl"


def _write(path: Path, rows: Sequence[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_load_with_their_fields() -> None:
    tasks = {t.id: t for t in load_tasks(TRAIN)}
    assert len(tasks) == 12
    t1 = tasks["t1"]
    assert (t1.kind, t1.site, t1.domain, t1.subdomain, t1.difficulty) == (
        "web", "louvre.fr", "travel", "museums", "easy",
    )  # fmt: skip
    assert t1.facts == ("shows opening hours", "hours are for the Louvre")
    assert t1.source == "pae-webvoyager"
    assert tasks["t2"].facts == ("shows opening hours",)  # a JSON-string rubric
    assert tasks["t3-sub1"].parent_id == "t3"
    assert tasks["t5"].facts == ("title of the newest diffusion paper",)
    assert tasks["t6"].site == "shop.example-hardware.com"


def test_parquet_and_json_load_the_same_tasks(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in TRAIN.read_text().splitlines()]
    flat = [
        {**r, "evaluator_reference": r["evaluator_reference"]
         if isinstance(r.get("evaluator_reference"), str)
         else json.dumps(r.get("evaluator_reference", []))}
        for r in rows
    ]  # fmt: skip
    columns = sorted({k for r in flat for k in r})  # every row with every column, as an export
    pq.write_table(
        pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in flat]),
        tmp_path / "rows.parquet",
    )
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    want = load_tasks(TRAIN)
    assert load_tasks(tmp_path / "rows.parquet") == want
    assert load_tasks(tmp_path / "rows.json") == want


@pytest.mark.parametrize(
    ("row", "field", "says"),
    [
        ({"task_name": "x", "website": "a.com"}, "task_id", "Field required"),
        ({"task_id": "a", "website": "a.com"}, "task_name", "Field required"),
        ({"task_id": "a", "task_name": "x", "website": "https://"}, "website", "no host"),
        ({"task_id": "a", "task_name": "x", "website": "a.com", "difficulty": "extreme"},
         "difficulty", "Input should be"),
        ({"task_id": "a", "task_name": "x", "website": "a.com", "evaluator_reference": "[1,"},
         "evaluator_reference", "not valid JSON"),
        ({"task_id": "a", "task_name": "x", "website": "a.com", "evaluator_reference": [3]},
         "evaluator_reference", "not text or a group"),
        ({"task_id": "a", "task_name": "x", "task": "y", "website": "a.com"},
         "task_name", "differ"),
        ({"task_id": True, "task_name": "x", "website": "a.com"}, "task_id", "string"),
    ],
)  # fmt: skip
def test_a_bad_row_names_row_and_field(
    tmp_path: Path, row: dict[str, Any], field: str, says: str
) -> None:
    path = _write(
        tmp_path / "rows.jsonl", [{"task_id": "ok", "task_name": "fine", "website": "b.org"}, row]
    )
    with pytest.raises(TaskRowError) as err:
        load_tasks(path)
    assert (err.value.row, err.value.field) == (2, field), str(err.value)
    assert says in err.value.reason


def test_repeated_ids_and_broken_lines_are_refused(tmp_path: Path) -> None:
    row = {"task_id": 7, "task": "x", "website": "a.com"}
    with pytest.raises(TaskRowError, match="row 2: task_id: '7' repeats row 1"):
        load_tasks(_write(tmp_path / "a.jsonl", [row, row]))
    (tmp_path / "b.jsonl").write_text('{"task_id": "a"\n')
    with pytest.raises(TaskRowError, match=r"row 1: \(row\): not valid JSON"):
        load_tasks(tmp_path / "b.jsonl")


def test_miniwob_tasks_are_rows_too() -> None:
    task = miniwob_task("click-button")
    assert (task.id, task.kind, task.site, task.miniwob) == (
        "miniwob/click-button", "miniwob", "miniwob", "click-button",
    )  # fmt: skip
    with pytest.raises(ValueError, match="not a MiniWoB task name"):
        miniwob_task("../etc/passwd")


def test_site_of() -> None:
    assert site_of("https://WWW.Louvre.FR/en/visit?x=1") == "louvre.fr"
    assert site_of("shop.example.com") == "shop.example.com"
    assert site_of("http://") == ""


def _bag_of_words(texts: Sequence[str]) -> Any:
    vocab: dict[str, int] = {}
    rows = [f.normalise(t).split() for t in texts]
    for words in rows:
        for w in words:
            vocab.setdefault(w, len(vocab))
    out = np.zeros((len(texts), max(1, len(vocab))))
    for i, words in enumerate(rows):
        for w in words:
            out[i, vocab[w]] += 1
    return out


def _stages(eval_tasks: list[GuiTask], threshold: float) -> list[f.Stage]:
    ranks = f.read_ranks((FIXTURES / "ranks.csv").read_text().splitlines())
    return [
        f.EvalOverlap(eval_tasks), f.Subordinates(eval_tasks), f.BenchmarkSites(),
        f.SitePopularity(ranks, max_rank=10_000, max_per_site=2),
        f.SemanticDedup(_bag_of_words, threshold=threshold),
    ]  # fmt: skip


def test_the_five_stages_count_what_they_drop_and_why() -> None:
    tasks, eval_tasks = load_tasks(TRAIN), load_tasks(EVAL)
    report = f.run_filters(tasks, _stages(eval_tasks, threshold=0.99))
    counts = [(s.name, s.seen, s.kept, dict(s.reasons)) for s in report.stages]
    assert counts == [
        ("eval_overlap", 12, 8, {"same_instruction": 2, "same_id": 1, "near_instruction": 1}),
        ("subordinate", 8, 6, {"subtask": 1, "fact_subset": 1}),
        ("benchmark_sites", 6, 4, {"benchmark_site": 2}),
        ("site_popularity", 4, 3, {"unranked": 1}),
        ("semantic_dedup", 3, 3, {}),
    ]
    assert [t.id for t in report.kept] == ["t3", "t6", "t7"]
    data = report.as_dict()
    assert (data["in"], data["out"]) == (12, 3)
    why = {
        d["task_id"]: (d["reason"], d["detail"]) for s in data["stages"] for d in s["dropped_tasks"]
    }
    assert why["t1"] == ("same_instruction", "evaluation task e1")
    assert why["t9"] == ("same_id", "evaluation task t9")
    assert why["t10"][0] == "near_instruction" and "e2 (jaccard 0.90)" in why["t10"][1]
    assert why["t3-sub1"] == ("subtask", "cut from t3")
    assert why["t4"] == ("fact_subset", "its 1 facts are among t3's 3")
    assert why["t5"] == ("benchmark_site", "arxiv.org")
    assert why["t11"] == ("benchmark_site", "github.com")
    assert why["t8"] == ("unranked", "obscure-weather-site.net")
    assert json.loads(json.dumps(data)) == data
    assert "site_popularity" in report.table()


def test_stages_compose_in_any_order_and_alone() -> None:
    tasks = load_tasks(TRAIN)
    alone = f.run_filters(tasks, [f.BenchmarkSites(["arxiv.org"])])
    assert [d.kind for _, d in alone.stages[0].dropped] == ["benchmark_site"]
    assert f.run_filters(tasks, []).kept == tasks
    ranks = f.read_ranks(["louvre.fr", "example-hardware.com"])  # rank = line number
    capped = f.run_filters(tasks, [f.SitePopularity(ranks, max_rank=5, max_per_site=1)])
    assert [t.id for t in capped.kept] == ["t1", "t6"]
    assert capped.stages[0].reasons["site_cap"] == 6  # t2, t3, t3-sub1, t4, t10 (louvre.fr); t7


def test_semantic_dedup_keeps_the_first_of_near_duplicates() -> None:
    tasks = [
        GuiTask("a", "web", "find the price of a red bike", "x.com"),
        GuiTask("b", "web", "find the price of a red bike please", "y.com"),
        GuiTask("c", "web", "book a table for two", "x.com"),
    ]
    report = f.run_filters(tasks, [f.SemanticDedup(_bag_of_words, threshold=0.9)])
    assert [t.id for t in report.kept] == ["a", "c"]
    assert report.stages[0].dropped[0][1].detail.startswith("a (cosine 0.9")
    by_site = f.run_filters(tasks, [f.SemanticDedup(_bag_of_words, 0.9, same_site_only=True)])
    assert [t.id for t in by_site.kept] == ["a", "b", "c"]


def test_filters_refuse_bad_settings() -> None:
    with pytest.raises(ValueError):
        f.SemanticDedup(_bag_of_words, threshold=0.0)
    with pytest.raises(ValueError):
        f.SitePopularity({}, max_rank=0)
    with pytest.raises(ValueError, match="not 'rank,site'"):
        f.read_ranks(["top,google.com"])

    class Broken:
        name = "broken"

        def apply(self, tasks: Sequence[GuiTask]) -> list[f.Decision | None]:
            return []

    with pytest.raises(ValueError, match="0 decisions for 12 tasks"):
        f.run_filters(load_tasks(TRAIN), [Broken()])
