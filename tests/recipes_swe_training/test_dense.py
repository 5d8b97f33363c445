"""Dense rewards: the process reward model through the real rewards service (a scripted judge
model), written into rollouts recorded by the real proxy; teacher log-probabilities from a
scripted teacher server answering in vLLM's and SGLang's formats over real HTTP."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from orchard.recipes.swe import dense

from orchard import AsyncRewards
from orchard.rollouts import RolloutResult, Status, Task

from .proxy_samples import Turn, recording_proxy, run_session
from .services import judged_rewards

TASK = Task("calc-1", "fix divide")
TURNS = [Turn("python -m pytest -q", "1 failed"), Turn("sed -i s/a/b/ calc/__init__.py", "")]
PATCH = "diff --git a/calc/__init__.py b/calc/__init__.py\n--- a/calc/__init__.py\n+++ b/calc/__init__.py\n@@ -1,2 +1,4 @@\n def divide(a, b):\n+    if b == 0:\n+        raise ZeroDivisionError('b')\n     return a / b\n"
TEST_EDIT = "diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n@@ -1,2 +1,3 @@\n+import pytest\n def test_divide():\n-    assert divide(1, 0)\n+    pytest.skip('flaky')\n"


def judge_model(body: dict[str, Any]) -> dict[str, Any]:
    if "UNJUDGEABLE" in body["messages"][1]["content"]:  # the prompt, also on the repair turn
        return {"content": "no idea"}
    scores = {f"R{i}": 0.8 for i in range(1, 8)}
    return {"content": json.dumps({"reasoning": "scripted", "scores": scores})}


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    with recording_proxy(tmp_path_factory.mktemp("proxy"), {TASK.prompt: TURNS}) as proxy:
        return run_session(proxy, TASK.prompt, TURNS, -1.0)


@pytest.fixture(scope="module")
def rewards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsyncRewards]:
    with judged_rewards(tmp_path_factory.mktemp("rewards"), judge_model) as (client, _):
        yield client


def _rollout(samples: list[dict[str, Any]], diff: str = PATCH, reward: float | None = -1.0,
             status: Status = Status.COMPLETED) -> RolloutResult:  # fmt: skip
    copies = [dict(s) for s in samples]
    return RolloutResult(TASK.id, "scripted", status, 3, diff, None, copies, "ses", reward=reward)


def test_reward_is_outcome_plus_alpha_j_written_into_every_sample(
    samples: list[dict[str, Any]], rewards: AsyncRewards
) -> None:
    result = _rollout(samples)
    got = asyncio.run(dense.apply_process_reward(result, TASK, rewards))
    assert got is not None and got.judged and not got.gated
    assert got.j == pytest.approx(0.8) and got.reward == pytest.approx(-1.0 + 0.5 * 0.8)
    assert result.reward == pytest.approx(-0.6) and result.detail["outcome_reward"] == -1.0
    (sample,) = result.samples
    assert sample["reward"] == pytest.approx(-0.6) and sample["outcome_reward"] == -1.0
    assert (
        sample["prm"]["scores"]["R2"] == pytest.approx(0.8)
        and sample["tokens"] == samples[0]["tokens"]
    )
    # the judge read the rollout's own conversation (from the recorded sample)
    assert [m["role"] for m in dense.trajectory_of(result)][:2] == ["system", "user"]
    alpha = asyncio.run(
        dense.process_reward(_rollout(samples, reward=1.0), TASK, rewards, alpha=0.25)
    )
    assert alpha is not None and alpha.reward == pytest.approx(1.0 + 0.25 * 0.8)


def test_the_gate_pays_a_hack_no_more_than_an_honest_failure(
    samples: list[dict[str, Any]], rewards: AsyncRewards
) -> None:
    result = _rollout(samples, diff=TEST_EDIT, reward=1.0)
    got = asyncio.run(dense.apply_process_reward(result, TASK, rewards))
    assert got is not None and got.gated and got.reward == -1.0 and got.outcome == 1.0
    assert any("test" in reason for reason in got.gate_reasons)
    assert result.samples[0]["reward"] == -1.0 and result.samples[0]["prm"]["gated"]


def test_no_verdict_keeps_the_outcome_or_drops_the_reward(
    samples: list[dict[str, Any]], rewards: AsyncRewards
) -> None:
    task = Task("calc-2", "UNJUDGEABLE task")
    got = asyncio.run(dense.process_reward(_rollout(samples), task, rewards))
    assert got is not None and not got.judged and got.reward == -1.0 and got.failure
    result = _rollout(samples)
    got = asyncio.run(dense.apply_process_reward(result, task, rewards, drop_unjudged=True))
    assert got is not None and got.reward is None
    assert result.reward is None and result.samples[0]["trainable"] is False


def test_aborted_and_ungraded_rollouts_are_not_scored(samples: list[dict[str, Any]]) -> None:
    class Refuse:
        async def score_process(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("an aborted rollout must not be scored")

    assert (
        asyncio.run(dense.process_reward(_rollout(samples, status=Status.ABORTED), TASK, Refuse()))
        is None
    )
    assert asyncio.run(dense.process_reward(_rollout(samples, reward=None), TASK, Refuse())) is None


def teacher_lp(previous: int, token: int) -> float:
    return -((previous * 31 + token) % 13 + 1) / 8.0


class Teacher:
    """vLLM's ``/v1/completions`` with ``prompt_logprobs`` and SGLang's ``/generate`` with
    ``return_logprob``, log-probabilities a function of the (previous, current) token."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.corrupt: str = ""

    def vllm(self, body: dict[str, Any]) -> dict[str, Any]:
        ids = body["prompt"]
        entries: list[Any] = [None] + [
            {str(t): {"logprob": teacher_lp(p, t), "rank": 1, "decoded_token": chr(t)}}
            for p, t in itertools.pairwise(ids)
        ]
        if self.corrupt == "short":
            entries = entries[:-1]
        if self.corrupt == "other_token":
            entries[-1] = {"99999": {"logprob": -0.1, "rank": 1, "decoded_token": "?"}}
        return {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                "choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": "length",
                             "prompt_logprobs": entries}]}  # fmt: skip

    def sglang(self, body: dict[str, Any]) -> dict[str, Any]:
        ids = body["input_ids"]
        entries = [[None, ids[0], None]] + [
            [teacher_lp(p, t), t, None] for p, t in itertools.pairwise(ids)
        ]
        if self.corrupt == "other_token":
            entries[3][1] += 1
        return {"text": "", "meta_info": {"id": "g1", "input_token_logprobs": entries,
                                          "finish_reason": {"type": "length", "length": 0}}}  # fmt: skip


@contextmanager
def teacher_server() -> Iterator[tuple[Teacher, str]]:
    teacher = Teacher()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            teacher.requests.append((self.path, body))
            if teacher.corrupt == "500":
                payload, status = {"error": {"message": "teacher down"}}, 500
            elif self.path == "/v1/completions":
                payload, status = teacher.vllm(body), 200
            elif self.path == "/generate":
                payload, status = teacher.sglang(body), 200
            else:
                payload, status = {"error": "not found"}, 404
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield teacher, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_teacher_logprobs_of_the_students_own_tokens(
    kind: str, samples: list[dict[str, Any]]
) -> None:
    sample = dict(samples[0])
    tokens, mask = sample["tokens"], sample["loss_mask"]
    with teacher_server() as (teacher, url):
        asyncio.run(dense.add_teacher_logprobs(sample, url, "teacher-7b", kind=kind))  # type: ignore[arg-type]
    path, body = teacher.requests[-1]
    if kind == "vllm":
        assert (
            path == "/v1/completions" and body["prompt"] == tokens and body["prompt_logprobs"] == 0
        )
        assert body["model"] == "teacher-7b" and body["max_tokens"] == 1
    else:
        assert (
            path == "/generate" and body["input_ids"] == tokens and body["return_logprob"] is True
        )
        assert body["logprob_start_len"] == 0 and body["sampling_params"]["max_new_tokens"] == 0
    got = sample["teacher_logprobs"]
    assert len(got) == len(tokens) and sample["teacher_model"] == "teacher-7b"
    for i, (m, value) in enumerate(zip(mask, got, strict=True)):
        assert value == (teacher_lp(tokens[i - 1], tokens[i]) if m else 0.0)
    assert sum(mask) > 0 and sample["logprobs"] == samples[0]["logprobs"]  # the student's stay


@pytest.mark.parametrize(("kind", "corrupt", "message"), [
    ("vllm", "short", "entries for"), ("vllm", "other_token", "is not in the teacher's answer"),
    ("sglang", "other_token", "expected id"), ("vllm", "500", "HTTP 500"), ("sglang", "500", "HTTP 500"),
])  # fmt: skip
def test_a_teacher_answer_that_does_not_fit_is_refused(
    kind: str, corrupt: str, message: str, samples: list[dict[str, Any]]
) -> None:
    sample = dict(samples[0])
    with teacher_server() as (teacher, url):
        teacher.corrupt = corrupt
        with pytest.raises(dense.TeacherError, match=message):
            asyncio.run(dense.add_teacher_logprobs(sample, url, "t", kind=kind))  # type: ignore[arg-type]
    assert "teacher_logprobs" not in sample


def test_a_sample_without_tokens_is_refused() -> None:
    sample = {
        "session_id": "s",
        "sample_index": 0,
        "token_exact": False,
        "tokens": None,
        "loss_mask": None,
    }
    with pytest.raises(dense.TeacherError, match="not token-exact"):
        asyncio.run(dense.add_teacher_logprobs(sample, "http://127.0.0.1:9/v1"))


def test_unreachable_teacher_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(dense.TeacherError, match=r"127\.0\.0\.1:9"):
        asyncio.run(dense.teacher_logprobs([1, 2, 3], "http://127.0.0.1:9/v1", timeout=5))
