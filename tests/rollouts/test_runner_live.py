"""The rollout runner on a real stack: a driver-side harness, driven by the scripted model
server through the recording proxy, fixes the sample repository in a real sandbox; the
repository ends fixed (the hidden tests pass in the sandbox), the diff is the fix, the
samples are token-exact; failures are ABORTED with the phase that failed, never graded; many
rollouts at once all complete and leave no sandbox behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import replace
from typing import Any

import pytest

from orchard import AsyncOrchard, AsyncSandbox
from orchard.rollouts import (
    Harness,
    HarnessRun,
    Limits,
    ModelProxyClient,
    RolloutResult,
    Status,
    Task,
    run_rollout,
    run_rollouts,
)
from tests.stack import REQUIRES_STACK

from .calc_policy import DONE, CalcPolicy
from .calc_task import (
    assert_token_exact,
    calc_task,
    gold_patch,
    grade_hidden_tests,
    without_index_lines,
)
from .conftest import RolloutStack
from .driver_harness import DriverBashHarness, RaisingHarness
from .sandbox_agent import InSandboxAgent

pytestmark = REQUIRES_STACK

LIMITS = Limits(max_steps=8, max_seconds=120, command_timeout=60)


def _marked(task: Task, name: str) -> Task:
    return replace(task, id=f"{task.id}-{name}", prompt=f"[rollout {name}] {task.prompt}")


async def _left(client: AsyncOrchard, result: RolloutResult) -> list[str]:
    """Sandboxes of this rollout's session still there (there must be none). A delete answers
    once the record says DELETING (the teardown runs on), so those are waited for a while."""
    if result.session_id is None:
        return []
    return await _gone(client, {"orchard.rollouts/session": result.session_id}, set())


async def _gone(client: AsyncOrchard, labels: dict[str, str] | None, before: set[str]) -> list[str]:
    """The sandboxes (with ``labels``) beyond ``before`` that are still there after up to 60 s
    of teardown: [] when every one was deleted."""
    deadline = time.monotonic() + 60
    while True:
        found = [s for s in await client.sandboxes.list(labels) if s.id not in before]
        if not found or time.monotonic() > deadline:
            return [f"{s.id} {s.state}" for s in found]
        if any(s.state != "deleting" for s in found):
            return [f"{s.id} {s.state}" for s in found]  # not even being deleted: a leak
        await asyncio.sleep(0.5)


def _assert_fixed(result: RolloutResult, policy: CalcPolicy, name: str) -> None:
    assert result.status is Status.COMPLETED, (result.fault, result.detail)
    assert result.reward == 1.0, result.detail
    assert result.fault is None and result.steps == 4
    assert result.submission == DONE
    assert without_index_lines(result.diff) == gold_patch()
    assert_token_exact(result, policy.answered[name])
    assert result.samples[0]["reward"] == 1.0 and result.samples[0]["trainable"] is True


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_driver_side_harness_fixes_the_sample_repository(
    rollout_stack: RolloutStack, stream: bool
) -> None:
    policy = CalcPolicy()
    rollout_stack.upstream.use(policy)
    name = f"fix-{'streamed' if stream else 'plain'}"

    async def body(client: AsyncOrchard, proxy: ModelProxyClient) -> None:
        result = await run_rollout(
            client, DriverBashHarness(stream=stream), _marked(calc_task(), name), proxy=proxy,
            model="scripted", limits=LIMITS, grade=grade_hidden_tests, model_version="step-7",
        )  # fmt: skip
        _assert_fixed(result, policy, name)
        assert result.samples[0]["model_versions"] == ["step-7"]
        # the harness's own transcript: the conversation as it kept it
        transcript = result.transcript
        assert [m["role"] for m in transcript] == ["system", "user"] + ["assistant", "tool"] * 3 + [
            "assistant"
        ]
        assert "3.0" in transcript[-2]["content"] and "passed" in transcript[-2]["content"]
        phases = result.detail["phases"]
        for phase in ("session", "sandbox", "files", "setup", "harness", "diff", "grade",
                      "delete", "finish", "samples"):  # fmt: skip
            assert phases[phase] >= 0, phases
        assert result.seconds >= phases["harness"]
        assert result.detail["model_calls"] == 4
        info = await proxy.session(result.session_id or "")
        assert info.finished and info.reward == 1.0 and info.fault == "" and info.calls == 4
        calls = await proxy.calls(result.session_id or "")
        assert [c["stream"] for c in calls] == [stream] * 4
        assert await _left(client, result) == []

    rollout_stack.run(body)


def test_failures_are_aborted_by_phase_and_never_graded(rollout_stack: RolloutStack) -> None:
    rollout_stack.upstream.use(CalcPolicy())
    graded: list[str] = []

    async def grade(sandbox: AsyncSandbox, task: Task, run: HarnessRun) -> float:
        graded.append(task.id)
        return 0.0

    async def body(client: AsyncOrchard, proxy: ModelProxyClient) -> None:
        task = calc_task()
        cases: dict[str, tuple[Harness, Task]] = {
            "bad-image": (DriverBashHarness(), replace(task, id="bad-image",
                                                        image="no-such-image:1")),
            "raises": (RaisingHarness(), task),
            "setup-fails": (DriverBashHarness(), replace(task, id="setup-fails",
                                                          setup=("exit 3",))),
        }  # fmt: skip
        results = {}
        for name, (harness, t) in cases.items():
            results[name] = await run_rollout(
                client, harness, t, proxy=proxy, model="scripted", limits=LIMITS, grade=grade
            )
        for name, result in results.items():
            assert result.status is Status.ABORTED, (name, result)
            assert result.reward is None, name
            info = await proxy.session(result.session_id or "")
            assert info.finished and info.fault == "infrastructure" and info.reward is None
            assert info.fault_message == result.fault
            assert await _left(client, result) == [], name
        assert results["bad-image"].fault_phase == "sandbox"
        assert "no-such-image" in (results["bad-image"].fault or "")
        assert results["raises"].fault == (
            "harness: RuntimeError: harness binary not found: /opt/none/bin/agent"
        )
        assert results["setup-fails"].fault_phase == "setup"
        assert "'exit 3' exited 3" in (results["setup-fails"].fault or "")
        assert "sandbox_id" not in results["bad-image"].detail
        assert "delete" in results["raises"].detail["phases"]
        assert graded == []

    rollout_stack.run(body)


class ForgivingHarness:
    """Says it finished whatever the model answered (as aider does, exiting 0 after printing
    the endpoint's error): the runner must not score such a run."""

    name = "forgiving"
    needs_tools_layer = False

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: Any, limits: Limits
    ) -> HarnessRun:
        import openai

        async with openai.AsyncOpenAI(
            base_url=model.openai_base_url, api_key="unused", max_retries=0
        ) as llm:
            for attempt in range(2):
                with contextlib.suppress(openai.APIStatusError):
                    await llm.chat.completions.create(
                        model=model.model, messages=[{"role": "user", "content": f"{attempt}"}]
                    )
        return HarnessRun(Status.COMPLETED, steps=2)


def test_a_run_whose_model_calls_all_failed_is_aborted_not_scored(
    rollout_stack: RolloutStack,
) -> None:
    graded: list[str] = []

    async def grade(sandbox: AsyncSandbox, task: Task, run: HarnessRun) -> float:
        graded.append(task.id)
        return 0.0

    async def body(client: AsyncOrchard, proxy: ModelProxyClient) -> None:
        rollout_stack.upstream.use(lambda _body: {"status": 500, "content": "upstream down"})
        result = await run_rollout(client, ForgivingHarness(), calc_task(), proxy=proxy,
                                   model="scripted", limits=LIMITS, grade=grade)  # fmt: skip
        assert result.status is Status.ABORTED and result.fault_phase == "proxy", result.fault
        assert "none of the rollout's 2 model calls was answered" in (result.fault or "")
        assert result.reward is None and graded == []
        info = await proxy.session(result.session_id or "")
        assert (info.fault, info.calls, info.answered_calls) == ("infrastructure", 2, 0)
        # one answered call of the two: the run is the agent's, and graded
        answers = iter([{"status": 500, "content": "blip"}, {"content": "fine"}])
        rollout_stack.upstream.use(lambda _body: next(answers))
        result = await run_rollout(client, ForgivingHarness(), calc_task(), proxy=proxy,
                                   model="scripted", limits=LIMITS, grade=grade)  # fmt: skip
        assert result.status is Status.COMPLETED and result.reward == 0.0, result.fault
        assert result.detail["model_calls"] == 2 and len(graded) == 1
        assert await _left(client, result) == []

    rollout_stack.run(body)


def test_an_unreachable_proxy_aborts_before_any_sandbox(rollout_stack: RolloutStack) -> None:
    async def body(client: AsyncOrchard, _proxy: ModelProxyClient) -> None:
        async with ModelProxyClient("http://127.0.0.1:9", rollout_stack.api_key) as dead:
            result = await run_rollout(
                client, DriverBashHarness(), calc_task(), proxy=dead, model="scripted"
            )
        assert result.status is Status.ABORTED and result.fault_phase == "proxy"
        assert result.session_id is None and "sandbox" not in result.detail["phases"]

    rollout_stack.run(body)


def test_sixteen_rollouts_at_once_all_complete_and_leave_nothing(
    rollout_stack: RolloutStack,
) -> None:
    policy = CalcPolicy()
    rollout_stack.upstream.use(policy)
    names = [f"many-{i:02d}" for i in range(16)]
    done: list[int] = []

    async def body(client: AsyncOrchard, proxy: ModelProxyClient) -> dict[str, Any]:
        before = {s.id for s in await client.sandboxes.list()}
        began = time.monotonic()
        results = await run_rollouts(
            client, DriverBashHarness(), [_marked(calc_task(), n) for n in names], proxy=proxy,
            model="scripted", concurrency=8, limits=LIMITS, grade=grade_hidden_tests,
            on_result=lambda i, _r: done.append(i),
        )  # fmt: skip
        seconds = time.monotonic() - began
        for name, result in zip(names, results, strict=True):
            assert result.task_id == f"calc_divide-{name}"  # in the order given
            _assert_fixed(result, policy, name)
        assert sorted(done) == list(range(16))
        assert len({r.session_id for r in results}) == 16
        assert await _gone(client, None, before) == []
        phases = {
            name: round(sorted(r.detail["phases"][name] for r in results)[8], 3)
            for name in results[0].detail["phases"]
        }
        return {"rollouts": 16, "concurrency": 8, "seconds": round(seconds, 2),
                "median_rollout_seconds": round(sorted(r.seconds for r in results)[8], 3),
                "median_phase_seconds": phases}  # fmt: skip

    print(json.dumps({"rollouts_at_once": rollout_stack.run(body)}))


def test_one_broken_job_of_many_is_its_own_result(rollout_stack: RolloutStack) -> None:
    """A job the runner cannot even start (a task whose file is not bytes: a caller's bug)
    is that job's ABORTED result; the jobs beside it complete."""
    policy = CalcPolicy()
    rollout_stack.upstream.use(policy)
    broken = replace(calc_task(), id="broken", files={"/testbed/x": 12345})  # type: ignore[dict-item]

    async def body(client: AsyncOrchard, proxy: ModelProxyClient) -> None:
        results = await run_rollouts(
            client, DriverBashHarness(),
            [_marked(calc_task(), "beside-1"), broken, _marked(calc_task(), "beside-2")],
            proxy=proxy, model="scripted", concurrency=3, limits=LIMITS, grade=grade_hidden_tests,
        )  # fmt: skip
        _assert_fixed(results[0], policy, "beside-1")
        _assert_fixed(results[2], policy, "beside-2")
        assert results[1].status is Status.ABORTED and results[1].fault_phase == "runner"
        assert results[1].reward is None
        info = await proxy.session(results[1].session_id or "")
        assert info.finished and info.fault == "infrastructure"
        assert await _left(client, results[1]) == []

    rollout_stack.run(body)


def test_the_diff_carries_untracked_binary_and_non_utf8_files_and_replays(
    rollout_stack: RolloutStack,
) -> None:
    """The final diff, taken by git in the sandbox: tracked edits, a deletion, a staged change,
    untracked text, binary and non-UTF-8 files; ignored files are not in it; the agent's index
    is untouched; ``git apply`` of it onto the starting commit gives the same tree."""
    edit = (
        "printf 'changed\\n' > a.txt && rm gone.txt && printf 'staged\\n' > s.txt && git add s.txt"
        " && printf 'new text\\n' > new.txt && mkdir -p deep/er && printf 'x' > deep/er/y.txt"
        " && head -c 256 /dev/urandom > blob.bin && printf '\\000' >> blob.bin && printf 'caf\\351\\n' > latin1.txt"
        " && printf 'junk\\n' > ignored.log"
    )  # fmt: skip
    setup = (
        "git init -q . && printf '*.log\\n' > .gitignore && printf 'a\\n' > a.txt"
        " && printf 'b\\n' > gone.txt && printf 's\\n' > s.txt && git add -A"
        " && git -c user.name=t -c user.email=t@t commit -qm base"
    )  # fmt: skip

    async def body(client: AsyncOrchard, _proxy: ModelProxyClient) -> None:
        from orchard.rollouts._repo import base_commit, final_diff

        async with await client.sandboxes.create(ttl=600) as box:
            await box.make_dir("/repo")
            assert (await box.exec(["sh", "-c", setup], cwd="/repo")).exit_code == 0
            base = await base_commit(box, "/repo", 60)
            assert base is not None and len(base) == 40
            assert (await box.exec(["sh", "-c", edit], cwd="/repo")).exit_code == 0
            status_before = (await box.exec(["git", "status", "--porcelain"], cwd="/repo")).stdout
            diff = await final_diff(box, "/repo", base, 60, 1 << 20)
            status_after = (await box.exec(["git", "status", "--porcelain"], cwd="/repo")).stdout
            assert status_after == status_before  # the agent's index as it left it
            raw = diff.encode("utf-8", "surrogateescape")
            assert b"caf\xe9" in raw and b"GIT binary patch" in raw
            for path in (
                "a.txt",
                "gone.txt",
                "s.txt",
                "new.txt",
                "deep/er/y.txt",
                "blob.bin",
                "latin1.txt",
            ):
                assert f"diff --git a/{path} b/{path}" in diff, path
            assert "ignored.log" not in diff
            await box.write_file("/tmp/agent.diff", raw)
            replay = (
                f"git clone -q /repo /replay && cd /replay && git checkout -q {base}"
                " && git apply --binary /tmp/agent.diff"
                " && diff -r -x .git -x ignored.log /repo /replay && echo same"
            )
            done = await box.exec(["sh", "-c", replay])
            assert done.stdout_text.strip() == "same", done.stderr_text
            # a workdir that is no repository has no base: the runner reports no diff
            await box.make_dir("/plain")
            assert await base_commit(box, "/plain", 60) is None

    rollout_stack.run(body)


def test_an_in_sandbox_agent_reaches_the_model_only_through_the_endpoint(
    rollout_stack: RolloutStack,
) -> None:
    """A harness that runs inside the sandbox (network none): the runner gives the sandbox its
    model endpoint and the harness the in-sandbox URLs; the repository ends fixed, the samples
    are token-exact. The sandbox reaches nothing else (the host's proxy URL is refused)."""
    policy = CalcPolicy()
    rollout_stack.upstream.use(policy)

    async def grade(sandbox: AsyncSandbox, task: Task, run: HarnessRun) -> float:
        host_url = rollout_stack.proxy_url + "/v1/sessions"
        probe = await sandbox.exec(
            [
                "python3",
                "-c",
                f"import urllib.request; urllib.request.urlopen({host_url!r}, timeout=5)",
            ]
        )
        assert probe.exit_code != 0  # the host's own proxy address: unreachable from inside
        return await grade_hidden_tests(sandbox, task, run)

    async def body(client: AsyncOrchard, proxy: ModelProxyClient) -> None:
        result = await run_rollout(
            client, InSandboxAgent(), _marked(calc_task(), "in-sandbox"), proxy=proxy,
            model="scripted", limits=LIMITS, grade=grade,
        )  # fmt: skip
        _assert_fixed(result, policy, "in-sandbox")
        calls = await proxy.calls(result.session_id or "")
        assert len(calls) == 4 and all(c["api"] == "chat" for c in calls)

    rollout_stack.run(body)
