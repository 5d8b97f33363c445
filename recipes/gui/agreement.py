"""How often the LLM judge agrees with MiniWoB's own success signal: rate, confusion, kappa.

The original rewarded its GUI agent with an LLM judge and never said how often the judge is
right. MiniWoB tasks carry ground truth (the page's own reward), so every MiniWoB rollout
that was judged is a labelled pair (judge says success, the task says success). The report
(:func:`agreement`, JSON by :meth:`Agreement.as_dict`):

- ``n``, ``agreement`` (share of pairs where both say the same);
- the confusion matrix with the truth as reference: ``tp`` (judge success, task success),
  ``fp`` (judge success, task failure: the judge would pay a failure), ``fn``, ``tn``;
- the judge's ``precision`` and ``recall`` of success, and ``false_positive_rate``;
- **Cohen's kappa**, agreement corrected for chance: ``(p_o - p_e) / (1 - p_e)`` with
  ``p_e`` the agreement two independent raters with the same marginals would reach. When
  ``p_e`` is 1 (both said the same one class every time) kappa is undefined: None, with
  the reason in ``kappa_note``, never a made-up 1.0 or 0.0.

Pairs come from the rollouts' reward records (:func:`pairs_of`): only rollouts where the judge
gave a verdict and the task gave its reward; the others are counted as ``skipped`` by reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Agreement:
    tp: int
    fp: int
    fn: int
    tn: int
    skipped: Mapping[str, int]

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.fn + self.tn

    @property
    def rate(self) -> float | None:
        return (self.tp + self.tn) / self.n if self.n else None

    def kappa(self) -> tuple[float | None, str]:
        n = self.n
        if n == 0:
            return None, "no pairs"
        po = (self.tp + self.tn) / n
        judge_yes, truth_yes = (self.tp + self.fp) / n, (self.tp + self.fn) / n
        pe = judge_yes * truth_yes + (1 - judge_yes) * (1 - truth_yes)
        if abs(1.0 - pe) < 1e-12:
            return (
                None,
                "undefined: judge and truth each gave a single class (chance agreement is 1)",
            )
        return (po - pe) / (1 - pe), ""

    def as_dict(self) -> dict[str, Any]:
        kappa, note = self.kappa()

        def share(a: int, b: int) -> float | None:
            return a / b if b else None

        return {
            "n": self.n, "agreement": self.rate, "kappa": kappa, "kappa_note": note,
            "confusion": {"tp": self.tp, "fp": self.fp, "fn": self.fn, "tn": self.tn,
                          "rows": "judge", "columns": "ground truth"},
            "precision": share(self.tp, self.tp + self.fp),
            "recall": share(self.tp, self.tp + self.fn),
            "false_positive_rate": share(self.fp, self.fp + self.tn),
            "truth_success_rate": share(self.tp + self.fn, self.n),
            "judge_success_rate": share(self.tp + self.fp, self.n),
            "skipped": dict(self.skipped),
        }  # fmt: skip


def agreement(
    pairs: Iterable[tuple[bool, bool]], skipped: Mapping[str, int] | None = None
) -> Agreement:
    """``pairs``: (judge says success, ground truth says success)."""
    counts: Counter[tuple[bool, bool]] = Counter((bool(j), bool(t)) for j, t in pairs)
    return Agreement(
        tp=counts[(True, True)], fp=counts[(True, False)], fn=counts[(False, True)],
        tn=counts[(False, False)], skipped=dict(skipped or {}),
    )  # fmt: skip


def pairs_of(records: Sequence[Mapping[str, Any]]) -> tuple[list[tuple[bool, bool]], Counter[str]]:
    """(judge, truth) pairs out of reward records (``GuiRollout.record()["reward_detail"]``:
    ``judge_success`` and ``truth_success``), and why the others were left out."""
    pairs: list[tuple[bool, bool]] = []
    skipped: Counter[str] = Counter()
    for record in records:
        detail = record.get("reward_detail") or {}
        judged, truth = detail.get("judge_success"), detail.get("truth_success")
        if record.get("status") == "aborted" and not detail:
            skipped["aborted"] += 1
        elif detail.get("judge_failed"):
            skipped["judge_failed"] += 1
        elif judged is None:
            skipped[str(detail.get("judge_skipped") or "no_verdict")] += 1
        elif truth is None:
            skipped["no_ground_truth"] += 1
        else:
            pairs.append((bool(judged), bool(truth)))
    return pairs, skipped
