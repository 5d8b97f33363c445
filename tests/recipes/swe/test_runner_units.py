"""The SWE runner's grading branches and the CLI's harness choice, without a stack.

The grading step talks to two services (the rewards service, the model proxy); their happy
path runs for real in test_swe_live.py. Here the branches a live stack will not produce on
demand (the platform failing a grade, the proxy refusing finish) are driven by recording
stand-ins with the same methods, to check what the runner records and tells the proxy."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from orchard.recipes.swe.agent import BashAgent
from orchard.recipes.swe.cli import harness_of
from orchard.recipes.swe.runner import (
    NotGradableError,
    SweOptions,
    SweRollout,
    _grade,
    instance_of,
    rollout_tasks,
)
from orchard.recipes.swe.tasks import load_tasks

import orchard
from orchard.rollouts import ProxyError, RolloutResult, Status
from orchard.rollouts.harnesses import HARNESSES


def report(reward: float | None, kind: str = "graded", resolved: bool = False) -> Any:
    return orchard.GradeReport(
        instance_id="i", kind=kind, resolved=resolved, resolution="", reward=reward,
        fail_to_pass=([], []), pass_to_pass=([], []), apply_method="git apply",
        reason="sandbox create failed" if reward is None else "", log_tail="",
        duration_seconds=1.0,
    )  # fmt: skip


class Rewards:
    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.asked: list[tuple[dict[str, Any], str]] = []

    async def grade(self, row: dict[str, Any], output: str, **kw: Any) -> Any:
        self.asked.append((row, output))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Client:
    def __init__(self, answer: Any) -> None:
        self.rewards = Rewards(answer)


class Proxy:
    def __init__(self, refuse: bool = False) -> None:
        self.finished: list[tuple[Any, ...]] = []
        self.refuse = refuse

    async def finish(
        self, session_id: str, reward: Any = None, fault: str = "", msg: str = ""
    ) -> None:
        if self.refuse:
            raise ProxyError(403, "SESSION_FORBIDDEN", "not yours")
        self.finished.append((session_id, reward, fault, msg))

    async def samples(self, session_id: str) -> list[dict[str, Any]]:
        return [{"session_id": session_id, "reward": self.finished[-1][1]}]


SAMPLES = Path(__file__).parents[3] / "recipes" / "swe" / "samples" / "instances.jsonl"


def test_a_loaded_task_carries_the_row_its_grader_is_given() -> None:
    (swe,) = load_tasks(SAMPLES, "orchard")
    (task,) = rollout_tasks([swe])
    assert instance_of(task) == swe.grading_instance()
    assert task.image == swe.image and "git init" in task.setup[0]
    with pytest.raises(NotGradableError, match="no instance row"):
        instance_of(swe.rollout_task())


def grade(
    answer: Any, diff: str = "diff --git a/x b/x", refuse: bool = False
) -> tuple[SweRollout, Client, Proxy]:
    (task,) = rollout_tasks(load_tasks(SAMPLES, "orchard"))
    result = RolloutResult(task.id, "bash", Status.COMPLETED, 3, diff, [], [], "ses_1",
                           submission="said so")  # fmt: skip
    rollout = SweRollout(0, 0, result)
    client, proxy = Client(answer), Proxy(refuse)
    asyncio.run(_grade(client, proxy, task, rollout, SweOptions()))  # type: ignore[arg-type]
    return rollout, client, proxy


def test_a_resolved_grade_is_the_reward_on_the_session_and_its_samples() -> None:
    rollout, client, proxy = grade(report(1.0, resolved=True))
    assert rollout.resolved and rollout.reward == 1.0 and rollout.grade_fault is None
    assert client.rewards.asked[0][0]["instance_id"] == "orchard-samples__calc_divide-1"
    assert client.rewards.asked[0][1].startswith("diff --git")
    assert proxy.finished == [("ses_1", 1.0, "", "")]
    assert rollout.result.samples == [{"session_id": "ses_1", "reward": 1.0}]


def test_no_diff_grades_the_submission_text() -> None:
    _, client, _ = grade(report(-1.0, kind="no_patch"), diff="")
    assert client.rewards.asked[0][1] == "said so"


@pytest.mark.parametrize(
    "answer", [report(None, kind="infrastructure"), orchard.InfrastructureError("down")]
)
def test_a_grade_the_platform_could_not_do_is_no_reward_and_an_infrastructure_fault(
    answer: Any,
) -> None:
    rollout, _, proxy = grade(answer)
    assert rollout.reward is None and not rollout.resolved
    assert rollout.grade_fault is not None and rollout.grade_fault.startswith("rewards: ")
    ((session, reward, fault, message),) = proxy.finished
    assert (session, reward, fault) == ("ses_1", None, "infrastructure") and message


def test_a_proxy_that_refuses_the_reward_leaves_the_rollout_without_one() -> None:
    rollout, _, _ = grade(report(1.0, resolved=True), refuse=True)
    assert rollout.reward is None and rollout.grade_fault is not None
    assert "SESSION_FORBIDDEN" in rollout.grade_fault


def test_the_harness_option() -> None:
    assert isinstance(harness_of("bash", BashAgent().config), BashAgent)
    made = harness_of("orchard.recipes.swe.agent:BashAgent", BashAgent().config)
    assert isinstance(made, BashAgent)
    for name, cls in HARNESSES.items():  # the tools layer's CLIs, by name
        assert type(harness_of(name, BashAgent().config)) is cls
    for bad in ("nope", "no.such.module:X", "orchard.recipes.swe.agent:Nothing",
                "orchard.recipes.swe.agent:truncate"):  # fmt: skip
        with pytest.raises(SystemExit):
            harness_of(bad, BashAgent().config)


def _args(*argv: str) -> Any:
    from orchard.recipes.swe.cli import parser

    return parser().parse_args(["run", "--out", "o", "--model", "m", *argv])


def test_run_reads_tasks_through_the_loaders_and_refuses_what_it_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchard.recipes.swe.cli import read_tasks

    (task,) = read_tasks(_args("--tasks", str(SAMPLES)))
    assert task.instance_id == "orchard-samples__calc_divide-1" and task.dataset == "orchard"
    with pytest.raises(SystemExit, match="no such task: nope"):
        read_tasks(_args("--tasks", str(SAMPLES), "--only", "nope"))
    with pytest.raises(SystemExit, match="is in both"):
        read_tasks(_args("--tasks", str(SAMPLES), "--tasks", str(SAMPLES)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "x"}\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl: row 1: "):
        read_tasks(_args("--tasks", str(bad)))
    monkeypatch.setenv("ORCHARD_HOME", str(tmp_path))
    with pytest.raises(SystemExit, match="make swe-tasks"):
        read_tasks(_args())


def test_bar_options_are_checked() -> None:
    from orchard.recipes.swe.cli import bar_config

    config = bar_config(_args("--bar-n", "2", "--bar-max", "4", "--bar-band", "0.5,0.5"))
    assert (config.group_size, config.max_rollouts, config.pmin, config.pmax) == (2, 4, 0.5, 0.5)
    with pytest.raises(SystemExit, match="max_rollouts"):
        bar_config(_args("--bar-n", "4", "--bar-max", "2"))
    with pytest.raises(SystemExit, match="--bar-"):
        bar_config(_args("--bar-band", "0.7,0.2"))


def test_missing_images_stop_the_run_before_any_rollout_naming_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``check_images`` asks the service (a stand-in listing one image) for every task's image."""
    from types import SimpleNamespace

    from orchard.recipes.swe import cli

    class Service:
        images = SimpleNamespace(list=lambda: [SimpleNamespace(name="debian:bookworm")])

        def __enter__(self) -> Service:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(cli.orchard, "Orchard", Service)
    (calc,) = load_tasks(SAMPLES, "orchard")
    other = dataclasses.replace(calc, instance_id="b", image="swebench/sweb.eval.x86_64.b:v1")
    assert cli.check_images([calc], pull=False) == [calc]
    with pytest.raises(SystemExit) as err:
        cli.check_images([calc, other], pull=False)
    assert "1 image(s)" in str(err.value) and "swebench/sweb.eval.x86_64.b:v1" in str(err.value)
    assert "'sweb.eval.x86_64.b:v1'" in str(err.value)
