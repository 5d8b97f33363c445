"""pass^k, pass@k and mean score on hand-computed cases; aborted trials are not counted."""

from __future__ import annotations

import json

import pytest
from orchard.recipes.claw.metrics import (
    TrialOutcome,
    markdown_table,
    pass_at_k,
    pass_hat_k,
    summarize,
    text_table,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "hat", "at"),
    [
        (3, 3, 3, 1.0, 1.0),
        (3, 2, 3, 0.0, 1.0),
        (3, 0, 3, 0.0, 0.0),
        (5, 3, 3, 1 / 10, 1.0),  # C(3,3)/C(5,3); 1 - C(2,3)/C(5,3) = 1 - 0
        (5, 1, 3, 0.0, 1 - 4 / 10),  # 1 - C(4,3)/C(5,3)
        (4, 2, 2, 1 / 6, 5 / 6),  # C(2,2)/C(4,2); 1 - C(2,2)/C(4,2)
        (4, 3, 1, 3 / 4, 3 / 4),  # k = 1: both are the pass rate
    ],
)
def test_estimators(n: int, c: int, k: int, hat: float, at: float) -> None:
    assert pass_hat_k(n, c, k) == pytest.approx(hat)
    assert pass_at_k(n, c, k) == pytest.approx(at)


def test_estimator_inputs() -> None:
    with pytest.raises(ValueError, match="fewer than k"):
        pass_hat_k(2, 1, 3)
    with pytest.raises(ValueError, match="within"):
        pass_at_k(3, 4, 3)
    with pytest.raises(ValueError, match="at least 1"):
        pass_at_k(3, 1, 0)


def T(task: str, cat: str, harness: str, score: float | None) -> TrialOutcome:
    return TrialOutcome(task, cat, harness, score, passed=score is not None and score >= 0.75)


def test_report_per_harness_and_category() -> None:
    outcomes = [
        # react: mail-a passes 3/3, mail-b 1/3, cal-a 0/3 with one aborted trial on top
        *[T("mail-a", "mail", "react", 1.0) for _ in range(3)],
        T("mail-b", "mail", "react", 1.0),
        T("mail-b", "mail", "react", 0.5),
        T("mail-b", "mail", "react", 0.0),
        T("cal-a", "calendar", "react", 0.25),
        T("cal-a", "calendar", "react", None),
        T("cal-a", "calendar", "react", 0.25),
        T("cal-a", "calendar", "react", 0.25),
        # codex: mail-a 2 trials + 2 aborted (too few for k = 3)
        T("mail-a", "mail", "codex", 1.0),
        T("mail-a", "mail", "codex", None),
        T("mail-a", "mail", "codex", 0.8),
        T("mail-a", "mail", "codex", None),
    ]
    report = summarize(outcomes, k=3)
    react, codex = report.harnesses
    assert react.harness == "react" and codex.harness == "codex"
    mail = react.categories["mail"]
    assert (mail.tasks, mail.trials, mail.aborted) == (2, 6, 0)
    assert mail.pass_hat_k == pytest.approx(0.5)  # (1 + 0) / 2
    assert mail.pass_at_k == pytest.approx(1.0)  # (1 + 1) / 2
    assert mail.mean_score == pytest.approx((1.0 + 0.5) / 2)  # task means 1.0 and 0.5
    cal = react.categories["calendar"]
    assert (cal.trials, cal.aborted, cal.pass_hat_k, cal.pass_at_k) == (3, 1, 0.0, 0.0)
    assert cal.mean_score == pytest.approx(0.25)
    overall = react.overall
    assert overall.pass_hat_k == pytest.approx(1 / 3)
    assert overall.pass_at_k == pytest.approx(2 / 3)
    assert overall.mean_score == pytest.approx((1.0 + 0.5 + 0.25) / 3)
    assert overall.aborted == 1 and overall.short == []
    # codex: 2 counted trials < k: left out of pass^k/pass@k, its mean still counts
    assert codex.overall.pass_hat_k is None and codex.overall.short == ["mail-a"]
    assert codex.overall.mean_score == pytest.approx(0.9)
    assert codex.overall.aborted == 2
    data = json.loads(json.dumps(report.to_json()))
    assert data["k"] == 3 and "unbiased" in data["estimator"]


def test_more_trials_than_k_use_the_estimators() -> None:
    outcomes = [T("t", "mail", "h", s) for s in (1.0, 1.0, 1.0, 0.0, 0.0)]
    (h,) = summarize(outcomes, k=3).harnesses
    assert h.overall.pass_hat_k == pytest.approx(0.1)
    assert h.overall.pass_at_k == pytest.approx(1.0)


def test_tables() -> None:
    outcomes = [T("t", "mail", "react", 1.0) for _ in range(3)]
    outcomes += [T("u", "files", "react", 0.0), T("u", "files", "react", None)]
    report = summarize(outcomes, k=3)
    md = markdown_table(report).splitlines()
    assert md[0] == "| harness | category | tasks | trials | aborted | pass^3 | pass@3 | mean |"
    assert md[2] == "| react | files | 1 | 1 | 1 | - | - | 0.000 |"
    assert md[3] == "| react | mail | 1 | 3 | 0 | 1.000 | 1.000 | 1.000 |"
    assert md[4] == "| react | all | 2 | 4 | 1 | 1.000 | 1.000 | 0.500 |"
    text = text_table(report)
    assert "fewer than 3 counted trials" in text and text.splitlines()[0].startswith("harness")


def test_a_task_in_two_categories_is_refused() -> None:
    with pytest.raises(ValueError, match="two categories"):
        summarize([T("t", "mail", "h", 1.0), T("t", "todo", "h", 1.0)])
