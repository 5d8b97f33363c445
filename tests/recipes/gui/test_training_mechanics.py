"""The step-budget curriculum, the success-weighted sampler and the judge-agreement report."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from orchard.recipes.gui.agreement import agreement, pairs_of
from orchard.recipes.gui.curriculum import StepCurriculum
from orchard.recipes.gui.sampling import DEFAULT_WEIGHTS, SuccessSampler


def test_the_budget_moves_from_15_to_30_once_the_rate_is_stable() -> None:
    c = StepCurriculum()
    assert c.budget == 15
    # rising (0.2, 0.5, 0.6): not stable; 0.6, 0.62, 0.58 is within 0.05: stable -> 30
    for wins, switched in [(10, False), (25, False), (30, False), (31, False), (29, True)]:
        assert c.record(wins, 50) is switched
    assert c.budget == 30
    assert c.switches == [{"round": 5, "from": 15, "to": 30, "rates": [0.6, 0.62, 0.58]}]


def test_stable_means_window_rounds_within_tolerance() -> None:
    c = StepCurriculum(window=3, tolerance=0.05)
    for wins in (50, 56, 52):  # spread 0.06 > 0.05: not stable
        assert not c.record(wins, 100)
    assert c.record(54, 100)  # 0.56, 0.52, 0.54: spread 0.04
    assert c.switches[0]["rates"] == [0.56, 0.52, 0.54]
    assert c.budget == 30 and c.history == []
    for wins in (54, 54, 54, 54):  # the last budget stays
        assert not c.record(wins, 100)
    assert c.budget == 30


def test_small_rounds_and_a_floor_do_not_count() -> None:
    c = StepCurriculum(min_rollouts=4, min_rate=0.2)
    for _ in range(5):
        assert not c.record(0, 3)  # too few graded: ignored
    assert c.history == [] and c.rounds == 5
    for _ in range(4):
        assert not c.record(1, 10)  # stable at 0.1, under the 0.2 floor
    assert c.budget == 15
    assert [c.record(3, 10) for _ in range(3)] == [False, False, True]
    state = c.state()
    assert state["budget"] == 30 and json.loads(json.dumps(state)) == state


@pytest.mark.parametrize("kwargs", [{"budgets": ()}, {"budgets": (30, 15)}, {"window": 1},
                                    {"tolerance": 2.0}])  # fmt: skip
def test_curriculum_refuses_bad_rules(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        StepCurriculum(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        StepCurriculum().record(3, 2)


def _sampler(**kwargs: object) -> SuccessSampler:
    s = SuccessSampler(["fail", "low", "mid", "high", "win", "new"], history=6, **kwargs)  # type: ignore[arg-type]
    for task, wins in [("fail", 0), ("low", 1), ("mid", 3), ("high", 5), ("win", 6)]:
        for i in range(6):
            s.update(task, i < wins)
    return s


def test_tasks_fall_into_the_five_buckets_by_observed_success() -> None:
    s = _sampler()
    assert {t: s.bucket(t) for t in s.task_ids} == {
        "fail": "all_fail", "low": "low", "mid": "mid", "high": "high", "win": "all_success",
        "new": "unseen",
    }  # fmt: skip
    assert [s.weight(t) for t in s.task_ids] == [0.5, 1.0, 1.5, 1.0, 0.5, 1.5]
    s.update("win", False)  # the window slides: 5 of the last 6
    assert s.bucket("win") == "high"
    assert s.state()["buckets"] == {"all_fail": 1, "low": 1, "mid": 1, "high": 2,
                                    "all_success": 0, "unseen": 1}  # fmt: skip


def test_draws_follow_the_weights_and_repeat_with_the_seed() -> None:
    s = _sampler(seed=7)
    draws = s.sample(12_000)
    assert (
        draws[:50] == _sampler(seed=7).sample(50)[:50]
        or draws[:50] == _sampler(seed=7).sample(12_000)[:50]
    )
    assert _sampler(seed=7).sample(200) == _sampler(seed=7).sample(200)
    assert _sampler(seed=7).sample(200) != _sampler(seed=8).sample(200)
    counts = Counter(draws)
    total = sum(s.weight(t) for t in s.task_ids)
    for task in s.task_ids:
        expected = 12_000 * s.weight(task) / total
        assert abs(counts[task] - expected) < 5 * expected**0.5, (task, counts[task], expected)


def test_weights_are_configurable_and_checked() -> None:
    s = _sampler(weights={"all_fail": 0.0, "all_success": 0.0})
    assert set(s.sample(500)) == {"low", "mid", "high", "new"}
    assert s.weights["mid"] == DEFAULT_WEIGHTS["mid"]
    with pytest.raises(ValueError, match="unknown buckets"):
        SuccessSampler(["a"], weights={"medium": 1.0})
    with pytest.raises(ValueError, match="negative"):
        SuccessSampler(["a"], weights={"low": -1.0})
    with pytest.raises(ValueError, match="nothing can be drawn"):
        SuccessSampler(["a"], weights={"unseen": 0.0}).sample(1)
    with pytest.raises(KeyError):
        _sampler().update("nope", True)


def test_agreement_rate_confusion_and_kappa() -> None:
    # 10 pairs: judge/truth  tp 4, fp 1, fn 2, tn 3
    pairs = [(True, True)] * 4 + [(True, False)] + [(False, True)] * 2 + [(False, False)] * 3
    report = agreement(pairs).as_dict()
    assert report["n"] == 10 and report["agreement"] == pytest.approx(0.7)
    assert report["confusion"] | {} == {"tp": 4, "fp": 1, "fn": 2, "tn": 3,
                                        "rows": "judge", "columns": "ground truth"}  # fmt: skip
    # p_o 0.7; p_e = 0.5*0.6 + 0.5*0.4 = 0.5; kappa = 0.2 / 0.5
    assert report["kappa"] == pytest.approx(0.4)
    assert report["precision"] == pytest.approx(0.8) and report["recall"] == pytest.approx(4 / 6)
    assert report["false_positive_rate"] == pytest.approx(0.25)
    assert agreement([(True, True), (False, False)]).as_dict()["kappa"] == pytest.approx(1.0)
    assert agreement([(True, False), (False, True)]).as_dict()["kappa"] == pytest.approx(-1.0)


def test_kappa_is_undefined_not_invented_when_both_give_one_class() -> None:
    report = agreement([(True, True)] * 5).as_dict()
    assert report["agreement"] == 1.0 and report["kappa"] is None
    assert "undefined" in report["kappa_note"]
    assert agreement([]).as_dict()["n"] == 0


def test_pairs_come_from_reward_records_and_the_rest_is_counted() -> None:
    records = [
        {"status": "completed", "reward_detail": {"judge_success": True, "truth_success": True}},
        {"status": "truncated", "reward_detail": {"judge_success": False, "truth_success": True}},
        {
            "status": "truncated",
            "reward_detail": {"judge_success": None, "judge_skipped": "malformed_stop"},
        },
        {"status": "aborted", "reward_detail": {}},
        {
            "status": "aborted",
            "reward_detail": {"judge_failed": "endpoint 500", "truth_success": True},
        },
        {"status": "completed", "reward_detail": {"judge_success": True, "truth_success": None}},
    ]
    pairs, skipped = pairs_of(records)
    assert pairs == [(True, True), (False, True)]
    assert skipped == {"malformed_stop": 1, "aborted": 1, "judge_failed": 1, "no_ground_truth": 1}
