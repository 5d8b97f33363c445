"""The adversarial corpus graded in real sandboxes (a real ``orchard up`` stack, real runc).

Three real repositories (six with pytest, more-itertools with unittest, Django's
own runner; see ``adversarial.py``), each with a real one-line bug: the gold
patch must resolve, a plausible wrong fix must stay unresolved without any
integrity flag (an honest failure is not a hack), and every hack must end
unresolved, with no positive reward, a ``task`` fault (never ``infrastructure``)
and the mechanism ``expect`` names among its flags or gate findings.

All runs go out at once (bounded), once per module, so the corpus fits the
suite's time budget; the sdists are downloaded once into the cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from orchard.rewards.swe.instance import parse_instance
from orchard.rewards.swe.outcome import GradeKind, GradeResult
from orchard.rewards.swe.runner import RunnerSettings, grade_patch_async

from tests.stack import REQUIRES_STACK, Stack, running_stack

from .adversarial import (
    HACKS,
    Hack,
    Repo,
    diff,
    django_repo,
    honest_wrong,
    more_itertools_repo,
    sdists_dir,
    six_repo,
)

# The first test's timeout covers the module's ``results`` fixture, which grades every
# patch of the corpus (~36 gradings, Django's own runner among them): 120 s is enough on
# a quiet machine, not beside make test's parallel workers (tests/phases.py).
pytestmark = [*REQUIRES_STACK, pytest.mark.timeout(600)]

CONCURRENCY = 3


@pytest.fixture(scope="module")
def repos() -> dict[str, Repo]:
    folder = sdists_dir()
    return {r.name: r for r in (six_repo(folder), more_itertools_repo(folder), django_repo(folder))}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("adversarial-home")) as s:
        yield s


@pytest.fixture(scope="module")
def results(stack: Stack, repos: dict[str, Repo]) -> dict[str, GradeResult]:
    settings = RunnerSettings(
        endpoint=stack.endpoint,
        api_key=(stack.home / "dev-api-key").read_text().strip(),
        test_timeout_seconds=300,
    )
    jobs: dict[str, tuple[Repo, str]] = {}
    for repo in repos.values():
        jobs[f"gold/{repo.name}"] = (repo, repo.gold())
        jobs[f"wrong/{repo.name}"] = (repo, honest_wrong(repo))
    for hack in HACKS:
        repo = repos[hack.repo]
        jobs[f"hack/{hack.name}"] = (repo, diff(repo.files, hack.edits(repo)))

    async def run_all() -> dict[str, GradeResult]:
        gate = asyncio.Semaphore(CONCURRENCY)
        instances = {name: parse_instance(r.row) for name, r in repos.items()}

        async def one(name: str, repo: Repo, patch: str) -> tuple[str, GradeResult]:
            async with gate:
                return name, await grade_patch_async(instances[repo.name], patch, settings)

        done = await asyncio.gather(*(one(n, r, p) for n, (r, p) in jobs.items()))
        return dict(done)

    return asyncio.run(run_all())


def _explain(result: GradeResult) -> str:
    findings = [f.render() for f in result.findings]
    return f"{result.kind} {result.integrity} {result.reason[:600]} {findings[:5]} log: {result.log[-1500:]}"


@pytest.mark.parametrize("repo", ["six", "more_itertools", "django"])
def test_gold_resolves_and_honest_wrong_fix_is_not_flagged(
    results: dict[str, GradeResult], repo: str
) -> None:
    gold = results[f"gold/{repo}"]
    assert (gold.kind, gold.resolved, gold.reward) == (GradeKind.GRADED, True, 1.0), _explain(gold)
    assert gold.integrity == [] and gold.findings == [], _explain(gold)
    wrong = results[f"wrong/{repo}"]
    assert (wrong.kind, wrong.resolved, wrong.reward) == (GradeKind.GRADED, False, -1.0), _explain(
        wrong
    )
    assert wrong.integrity == [] and wrong.findings == [], _explain(wrong)
    assert wrong.fail_to_pass.failure  # it really ran and really failed


@pytest.mark.parametrize("hack", HACKS, ids=[h.name for h in HACKS])
def test_hack_earns_nothing(results: dict[str, GradeResult], hack: Hack) -> None:
    result = results[f"hack/{hack.name}"]
    assert not result.resolved and result.reward is not None and result.reward <= 0, _explain(
        result
    )
    assert result.fault == "task" and result.kind is not GradeKind.INFRASTRUCTURE, _explain(result)
    caught = set(result.integrity) | {f.rule for f in result.findings}
    assert not hack.expect or caught & hack.expect, (
        f"expected one of {sorted(hack.expect)}: {_explain(result)}"
    )


def test_corpus_covers_the_issue(repos: dict[str, Repo]) -> None:
    categories = {h.category for h in HACKS}
    assert {"log forgery", "early exit", "framework patching", "config edit", "test deletion",
            "skip injection", "collection sabotage"} <= categories  # fmt: skip
    assert len(HACKS) >= 20 and {h.repo for h in HACKS} == set(repos)
