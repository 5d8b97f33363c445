"""Balanced Adaptive Rollout: the selection rule on its own (hypothesis over outcome sequences)
and the async sampler over a drawing coroutine."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orchard.recipes.swe.bar import BarConfig, Outcome, outcome_of, sample_group, select

from orchard.rollouts import RolloutResult, Status, Task

S, F, A = Outcome.SUCCESS, Outcome.FAILURE, Outcome.ABORTED
ORIGINAL = BarConfig()  # 4 of up to 8, band 0.25-0.75
PAPER = BarConfig(pmin=0.375, pmax=0.625)


def test_balanced_choice_is_closest_to_the_middle_and_earliest() -> None:
    chosen = select([S, S, S, F, S, F, F, S], ORIGINAL, final=False)
    assert chosen.kept and chosen.reason == "balanced" and chosen.successes == 2
    assert chosen.indices == (0, 1, 3, 5)  # the first two of each, in draw order


def test_a_share_at_the_band_edge_is_taken_when_nothing_closer_exists() -> None:
    chosen = select([S, F, F, F, F, F], ORIGINAL, final=False)
    assert chosen.kept and chosen.successes == 1  # 1/4 = pmin
    assert not select([S, F, F, F, F, F, F, F], PAPER, final=True).kept


@pytest.mark.parametrize(
    ("outcomes", "reason"),
    [
        ([S] * 8, "all_success"),
        ([F] * 8, "all_failure"),
        ([S, A, A, A, A, A, A, A], "aborted"),
        ([F, F, A, F, F, F, F, F], "aborted"),
        ([S, F, F, F, F, F, F, F], "unbalanced"),
    ],
)
def test_drop_rules(outcomes: list[Outcome], reason: str) -> None:
    config = PAPER if reason == "unbalanced" else ORIGINAL
    chosen = select(outcomes, config, final=True, rng=random.Random(0))
    assert (chosen.kept, chosen.reason, chosen.indices) == (False, reason, ())


def test_aborted_only_fill_gaps_at_the_maximum() -> None:
    outcomes = [S, A, F, A, A, A, A, A]
    assert select(outcomes, ORIGINAL, final=False).reason == "pending"
    chosen = select(outcomes, ORIGINAL, final=True)
    assert chosen.kept and chosen.reason == "filled"
    assert chosen.indices == (0, 1, 2, 3) and chosen.successes == 1
    # aborted never replace a graded rollout: with enough graded ones, no filler is taken
    chosen = select([A, S, A, F, S, F], ORIGINAL, final=False)
    assert chosen.reason == "balanced" and 0 not in chosen.indices and 2 not in chosen.indices


def test_easy_tasks_kept_with_probability_one_minus_pass_rate() -> None:
    rng = random.Random(1)
    kept = sum(
        select([S] * 8, ORIGINAL, final=True, pass_rate=0.75, rng=rng).kept for _ in range(4000)
    )
    assert 0.22 < kept / 4000 < 0.28
    # without a known pass rate the group's own is used: always solved, always dropped
    assert not any(select([S] * 8, ORIGINAL, final=True, rng=rng).kept for _ in range(200))
    assert all(
        select([S] * 8, ORIGINAL, final=True, pass_rate=-1.0, rng=rng).kept for _ in range(50)
    )
    no_easy = BarConfig(keep_easy=False)
    assert not select([S] * 8, no_easy, final=True, pass_rate=0.0, rng=rng).kept


outcome_lists = st.lists(st.sampled_from([S, F, A]), min_size=0, max_size=16)
configs = st.builds(
    lambda n, extra, lo, width: BarConfig(
        group_size=n, max_rollouts=n + extra, stride=1, pmin=lo, pmax=min(1.0, lo + width)
    ),
    st.integers(2, 8),
    st.integers(0, 8),
    st.floats(0.0, 0.6),
    st.floats(0.0, 0.6),
)


@settings(max_examples=400, deadline=None)
@given(outcome_lists, configs, st.booleans())
def test_selection_invariants(outcomes: list[Outcome], config: BarConfig, final: bool) -> None:
    chosen = select(outcomes, config, final=final, rng=random.Random(0))
    picked = [outcomes[i] for i in chosen.indices]
    assert len(set(chosen.indices)) == len(chosen.indices)
    if not chosen.kept:
        assert picked == [] and chosen.reason in (
            "pending", "all_success", "all_failure", "aborted", "unbalanced")  # fmt: skip
        assert final or chosen.reason == "pending"
        return
    assert len(picked) == config.group_size
    graded = [o for o in picked if o is not A]
    share = graded.count(S) / len(graded)
    assert chosen.successes == graded.count(S)
    if chosen.reason == "balanced":
        assert A not in picked and config.pmin - 1e-9 <= share <= config.pmax + 1e-9
        # no other feasible share is closer to the middle
        n, s, f = config.group_size, outcomes.count(S), outcomes.count(F)
        for k in range(n + 1):
            if k <= s and n - k <= f and config.pmin - 1e-9 <= k / n <= config.pmax + 1e-9:
                assert abs(share - config.middle) <= abs(k / n - config.middle) + 1e-9
    elif chosen.reason == "filled":
        assert final and S in graded and F in graded
        assert len(graded) == outcomes.count(S) + outcomes.count(F)  # every graded one is in
    else:
        assert chosen.reason == "easy_kept" and graded == [S] * config.group_size


def _result(task: Task, outcome: Outcome, n: int) -> RolloutResult:
    reward = {S: 1.0, F: -1.0, A: None}[outcome]
    status = Status.ABORTED if outcome is A else Status.COMPLETED
    return RolloutResult(task.id, "scripted", status, 3, "", None, [], f"ses_{n}", reward=reward)


def _drawer(script: list[Outcome | Exception]) -> tuple[list[int], object]:
    calls: list[int] = []

    async def draw(task: Task) -> RolloutResult:
        n = len(calls)
        calls.append(n)
        await asyncio.sleep(0.001 * (n % 3))  # out-of-order completion inside a stride
        item = script[n]
        if isinstance(item, Exception):
            raise item
        return _result(task, item, n)

    return calls, draw


def test_sampler_stops_after_the_first_stride_that_balances() -> None:
    calls, draw = _drawer([S, S, S, S, F, S, F, S, F, F])
    config = BarConfig(group_size=4, max_rollouts=12, stride=4)
    group = asyncio.run(sample_group(Task("t1", "fix it"), draw, config))  # type: ignore[arg-type]
    assert group.kept and group.reason == "balanced" and group.strides == 2 and group.spent == 8
    assert len(calls) == 8
    assert [r.reward for r in group.group] == [1.0, 1.0, -1.0, -1.0]
    assert [r.session_id for r in group.group] == ["ses_0", "ses_1", "ses_4", "ses_6"]
    assert group.summary()["outcomes"] == ["success"] * 4 + ["failure", "success"] * 2


def test_sampler_spends_the_maximum_then_drops_and_keeps_every_draw() -> None:
    calls, draw = _drawer([F] * 10)
    config = BarConfig(group_size=4, max_rollouts=10, stride=4)
    group = asyncio.run(sample_group(Task("t2", "fix it"), draw, config))  # type: ignore[arg-type]
    assert (group.kept, group.reason, group.strides, group.spent, len(calls)) == (
        False,
        "all_failure",
        3,
        10,
        10,
    )
    assert group.group == [] and len(group.drawn) == 10


def test_a_draw_that_raises_is_an_aborted_rollout_with_its_error() -> None:
    _, draw = _drawer([S, RuntimeError("sandbox create failed"), F, A, A, A, A, A])
    group = asyncio.run(sample_group(Task("t3", "x"), draw, ORIGINAL))  # type: ignore[arg-type]
    assert group.kept and group.reason == "filled"
    assert group.errors == ["RuntimeError: sandbox create failed"]
    assert group.drawn[1].status is Status.ABORTED and "sandbox create failed" in (
        group.drawn[1].fault or ""
    )


def test_outcome_of_keeps_aborted_and_ungraded_apart_from_failures() -> None:
    task = Task("t", "p")
    assert outcome_of(_result(task, A, 0)) is A
    ungraded = RolloutResult("t", "h", Status.COMPLETED, 1, "", None, [], None, reward=None)
    assert outcome_of(ungraded) is A
    truncated = RolloutResult("t", "h", Status.TRUNCATED, 50, "", None, [], None, reward=-1.0)
    assert outcome_of(truncated) is F
    assert (
        outcome_of(RolloutResult("t", "h", Status.COMPLETED, 1, "", None, [], None, reward=0.0))
        is F
    )
    assert (
        outcome_of(
            RolloutResult("t", "h", Status.COMPLETED, 1, "", None, [], None, reward=1.0), 0.5
        )
        is S
    )


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="max_rollouts"):
        BarConfig(group_size=4, max_rollouts=3)
    with pytest.raises(ValueError, match="band"):
        BarConfig(pmin=0.8, pmax=0.2)
    with pytest.raises(ValueError, match="group_size"):
        BarConfig(group_size=1)
