"""The five-stage task filter: composable steps, each counting what it kept and dropped and why.

The original (Orchard-GUI) built its RL set from WebGym's rows in five stages; only their
names are public. Each stage here is our reading of its name, written down so it can be
tested and argued with:

1. :class:`EvalOverlap` - a training task that *is* an evaluation task: the same id, the same
   instruction once normalised (case, spacing, punctuation), or on the same site a word-set
   Jaccard similarity of at least ``jaccard`` (0.8) with one. Evaluation leaks are the one
   mistake a filter must not let through, so this stage runs first.
2. :class:`Subordinates` - a task cut out of another (WebGym decomposes a task into subtasks
   by taking subsets of its rubric's fact groups): its ``parent_task_id`` names a task of the
   set or of an evaluation set, or, on the same site, its facts are a proper subset of
   another task's. The parent is kept, the part dropped.
3. :class:`BenchmarkSites` - tasks on the websites of the evaluation benchmarks (a site and
   its subdomains), so evaluation runs on sites the policy never trained on
   (:data:`WEBVOYAGER_SITES` by default; any list).
4. :class:`SitePopularity` - tasks on sites in a popularity ranking (rank <= ``max_rank``; a
   site not in the ranking is dropped, ``unranked``), at most ``max_per_site`` per site so a
   few large sites do not dominate (the first in file order are kept).
5. :class:`SemanticDedup` - near-duplicate instructions: sentence embeddings
   (:mod:`orchard.recipes.gui.embeddings`, all-MiniLM-L6-v2 from a wheel), greedily in order,
   a task whose cosine similarity with a kept one is at least ``threshold`` (0.8) is dropped
   (``same_site_only``: compared within a site only). 0.8 from a measurement on this
   model: paraphrased task pairs score 0.815 and 0.851, unrelated tasks under 0.34
   (``tests/recipes/gui/test_dedup_minilm.py``).

:func:`run_filters` applies stages in order; its :class:`FilterReport` has, per stage, the
count in and out, the drops by reason kind and each dropped task with its reason (JSON:
:meth:`FilterReport.as_dict`). A stage is anything with a ``name`` and
``apply(tasks) -> list[Decision | None]`` (None: kept), so stages are reordered, left out
or added freely.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .tasks import GuiTask, site_of

WEBVOYAGER_SITES = (
    "allrecipes.com", "amazon.com", "apple.com", "arxiv.org", "github.com", "booking.com",
    "espn.com", "coursera.org", "dictionary.cambridge.org", "bbc.com", "bbc.co.uk",
    "google.com", "huggingface.co", "wolframalpha.com",
)  # fmt: skip
"""WebVoyager's fifteen sites (Google Flights, Map and Search are all google.com)."""


@dataclass(frozen=True)
class Decision:
    """Why a stage dropped a task: ``kind`` (counted) and ``detail`` (which other task, how close)."""

    kind: str
    detail: str = ""


class Stage(Protocol):
    name: str

    def apply(self, tasks: Sequence[GuiTask]) -> list[Decision | None]: ...


@dataclass
class StageReport:
    name: str
    seen: int
    kept: int
    reasons: Counter[str] = field(default_factory=Counter)
    dropped: list[tuple[str, Decision]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.name, "in": self.seen, "out": self.kept,
            "dropped": self.seen - self.kept, "reasons": dict(self.reasons),
            "dropped_tasks": [{"task_id": t, "reason": d.kind, "detail": d.detail}
                              for t, d in self.dropped],
        }  # fmt: skip


@dataclass
class FilterReport:
    stages: list[StageReport]
    kept: list[GuiTask]
    total: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "in": self.total, "out": len(self.kept),
            "stages": [s.as_dict() for s in self.stages],
        }  # fmt: skip

    def table(self) -> str:
        rows = [f"{'stage':<20} {'in':>7} {'out':>7}  reasons"]
        for s in self.stages:
            why = ", ".join(f"{k} {v}" for k, v in sorted(s.reasons.items()))
            rows.append(f"{s.name:<20} {s.seen:>7} {s.kept:>7}  {why}")
        return "\n".join(rows) + "\n"


def run_filters(tasks: Sequence[GuiTask], stages: Sequence[Stage]) -> FilterReport:
    """Apply ``stages`` in order; what each kept goes to the next."""
    current = list(tasks)
    reports = []
    for stage in stages:
        decisions = stage.apply(current)
        if len(decisions) != len(current):
            raise ValueError(
                f"stage {stage.name}: {len(decisions)} decisions for {len(current)} tasks"
            )
        report = StageReport(stage.name, len(current), 0)
        kept = []
        for task, decision in zip(current, decisions, strict=True):
            if decision is None:
                kept.append(task)
            else:
                report.reasons[decision.kind] += 1
                report.dropped.append((task.id, decision))
        report.kept = len(kept)
        reports.append(report)
        current = kept
    return FilterReport(reports, current, len(tasks))


def normalise(text: str) -> str:
    """Lowercase, accents folded, punctuation to spaces, whitespace collapsed."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    return " ".join(re.sub(r"[^\w]+", " ", text).split())


def jaccard(a: str, b: str) -> float:
    sa, sb = set(normalise(a).split()), set(normalise(b).split())
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


class EvalOverlap:
    """Stage 1: drop training tasks that are evaluation tasks (id, text, near-identical text)."""

    name = "eval_overlap"

    def __init__(self, eval_tasks: Iterable[GuiTask], jaccard: float = 0.8) -> None:
        self.eval_tasks = list(eval_tasks)
        self.threshold = jaccard
        self._ids = {t.id: t for t in self.eval_tasks}
        self._texts = {normalise(t.instruction): t for t in self.eval_tasks}
        self._by_site: dict[str, list[GuiTask]] = {}
        for t in self.eval_tasks:
            self._by_site.setdefault(t.site, []).append(t)

    def apply(self, tasks: Sequence[GuiTask]) -> list[Decision | None]:
        out: list[Decision | None] = []
        for task in tasks:
            out.append(self._overlap(task))
        return out

    def _overlap(self, task: GuiTask) -> Decision | None:
        if task.id in self._ids:
            return Decision("same_id", f"evaluation task {task.id}")
        same = self._texts.get(normalise(task.instruction))
        if same is not None:
            return Decision("same_instruction", f"evaluation task {same.id}")
        for other in self._by_site.get(task.site, ()):
            score = jaccard(task.instruction, other.instruction)
            if score >= self.threshold:
                return Decision(
                    "near_instruction", f"evaluation task {other.id} (jaccard {score:.2f})"
                )
        return None


class Subordinates:
    """Stage 2: drop subtasks (by ``parent_task_id``, or facts a proper subset of another's)."""

    name = "subordinate"

    def __init__(self, eval_tasks: Iterable[GuiTask] = ()) -> None:
        self.eval_ids = {t.id for t in eval_tasks}

    def apply(self, tasks: Sequence[GuiTask]) -> list[Decision | None]:
        ids = {t.id for t in tasks}
        by_site: dict[str, list[tuple[GuiTask, frozenset[str]]]] = {}
        for t in tasks:
            if t.facts:
                by_site.setdefault(t.site, []).append((t, frozenset(normalise(f) for f in t.facts)))
        out: list[Decision | None] = []
        for task in tasks:
            if task.parent_id is not None and task.parent_id in self.eval_ids:
                out.append(
                    Decision("subtask_of_eval", f"cut from evaluation task {task.parent_id}")
                )
                continue
            if task.parent_id is not None and task.parent_id in ids:
                out.append(Decision("subtask", f"cut from {task.parent_id}"))
                continue
            out.append(self._subset(task, by_site.get(task.site, [])))
        return out

    @staticmethod
    def _subset(task: GuiTask, site: list[tuple[GuiTask, frozenset[str]]]) -> Decision | None:
        if not task.facts:
            return None
        mine = frozenset(normalise(f) for f in task.facts)
        for other, facts in site:
            if other.id != task.id and mine < facts:
                return Decision(
                    "fact_subset", f"its {len(mine)} facts are among {other.id}'s {len(facts)}"
                )
        return None


def _on_site(site: str, sites: Iterable[str]) -> str | None:
    for s in sites:
        if site == s or site.endswith("." + s):
            return s
    return None


class BenchmarkSites:
    """Stage 3: drop tasks on the benchmarks' sites (a listed site or any of its subdomains)."""

    name = "benchmark_sites"

    def __init__(self, sites: Iterable[str] = WEBVOYAGER_SITES) -> None:
        self.sites = tuple(site_of(s) for s in sites)
        if not all(self.sites):
            raise ValueError(f"a benchmark site without a host: {list(sites)!r}")

    def apply(self, tasks: Sequence[GuiTask]) -> list[Decision | None]:
        out: list[Decision | None] = []
        for task in tasks:
            hit = _on_site(task.site, self.sites)
            out.append(None if hit is None else Decision("benchmark_site", hit))
        return out


class SitePopularity:
    """Stage 4: keep tasks on ranked sites (rank <= ``max_rank``), at most ``max_per_site`` each.

    ``ranks``: site -> rank (1 = most popular), e.g. a Tranco-style list read with
    :func:`read_ranks`. A subdomain takes its parent site's rank when it has none itself.
    """

    name = "site_popularity"

    def __init__(
        self, ranks: Mapping[str, int], max_rank: int, max_per_site: int | None = None
    ) -> None:
        if max_rank < 1 or (max_per_site is not None and max_per_site < 1):
            raise ValueError("max_rank and max_per_site must be at least 1")
        self.ranks = {site_of(s): int(r) for s, r in ranks.items()}
        self.max_rank, self.max_per_site = max_rank, max_per_site

    def rank(self, site: str) -> int | None:
        parts = site.split(".")
        for i in range(len(parts) - 1):
            rank = self.ranks.get(".".join(parts[i:]))
            if rank is not None:
                return rank
        return None

    def apply(self, tasks: Sequence[GuiTask]) -> list[Decision | None]:
        per_site: Counter[str] = Counter()
        out: list[Decision | None] = []
        for task in tasks:
            rank = self.rank(task.site)
            if rank is None:
                out.append(Decision("unranked", task.site))
            elif rank > self.max_rank:
                out.append(Decision("below_rank", f"{task.site} ranks {rank} > {self.max_rank}"))
            elif self.max_per_site is not None and per_site[task.site] >= self.max_per_site:
                out.append(Decision("site_cap", f"{task.site} has {self.max_per_site} already"))
            else:
                per_site[task.site] += 1
                out.append(None)
        return out


def read_ranks(rows: Iterable[str]) -> dict[str, int]:
    """A ranking as ``rank,site`` lines (Tranco's CSV) or ``site`` lines (rank = line number)."""
    ranks: dict[str, int] = {}
    for number, line in enumerate(rows, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        first, _, second = text.partition(",")
        if second:
            if not first.strip().isdigit():
                raise ValueError(f"line {number}: {text[:100]!r} is not 'rank,site'")
            ranks.setdefault(site_of(second), int(first))
        else:
            ranks.setdefault(site_of(first), number)
    return ranks


Embed = Callable[[Sequence[str]], Any]
"""Texts -> an (n, d) array of unit-length embeddings (numpy)."""


class SemanticDedup:
    """Stage 5: drop a task whose instruction embeds within ``threshold`` cosine of a kept one."""

    name = "semantic_dedup"

    def __init__(self, embed: Embed, threshold: float = 0.8, same_site_only: bool = False) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], not {threshold}")
        self.embed, self.threshold, self.same_site_only = embed, threshold, same_site_only

    def apply(self, tasks: Sequence[GuiTask]) -> list[Decision | None]:
        import numpy as np

        if not tasks:
            return []
        vectors = np.asarray(self.embed([t.instruction for t in tasks]), dtype=np.float64)
        if vectors.shape[0] != len(tasks):
            raise ValueError(f"the embedder gave {vectors.shape[0]} vectors for {len(tasks)} texts")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.where(norms == 0, 1.0, norms)
        kept: list[int] = []
        out: list[Decision | None] = []
        for i, task in enumerate(tasks):
            pool = [j for j in kept if not self.same_site_only or tasks[j].site == task.site]
            if pool:
                sims = vectors[pool] @ vectors[i]
                best = int(np.argmax(sims))
                if sims[best] >= self.threshold:
                    other = tasks[pool[best]]
                    out.append(Decision("near_duplicate", f"{other.id} (cosine {sims[best]:.3f})"))
                    continue
            kept.append(i)
            out.append(None)
        return out
