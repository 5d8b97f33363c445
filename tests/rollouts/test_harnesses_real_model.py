"""Opt-in (``ORCHARD_TEST_LLM=1``, ``make test-llm``): the real harness CLIs of the tools layer
against a real small model, SmolLM2-135M served by llama.cpp (``tests/llama_server.py``) as the
upstream of ``orchard up``'s recording proxy, each in its own sandbox on the calc_divide task.

A 135M model fixes nothing; what this checks is that each CLI's real requests (its own system
prompt, tools and parameters, in its own wire format, translated by the proxy where it is not
Chat) are accepted by a real inference server, that the answers reach the CLI and that the
calls are recorded as samples (llama.cpp returns no token ids: the samples say they are not
token-exact).

Last run (2026-12-02, n_ctx 8192): aider, Claude Code, Codex and mini-swe-agent COMPLETED
(1, 1, 1 and 3 answered calls); OpenClaw answered twice and then gave up with its own
``fallback_exhausted: Agent couldn't generate a response`` (the 135M model's answers were not
usable to it), which its adapter reports as ABORTED: ``MODEL_GAVE_UP`` below. This test first
showed that an exec silent for 150 s was lost to gRPC's ``too_many_pings`` (fixed in
``orchard.common.service_runner``): a harness waiting on a slow model is such an exec.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from orchard import AsyncOrchard
from orchard.rollouts import Limits, ModelProxyClient, SandboxOptions, Status, run_rollout
from orchard.rollouts.harnesses import HARNESSES
from tests.llama_server import llama_server
from tests.stack import REQUIRES_STACK, TOOLS_DIR, running_stack

from .calc_task import calc_task
from .conftest import PolicyServer, RolloutStack

pytestmark = [
    *REQUIRES_STACK,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.environ.get("ORCHARD_TEST_LLM") != "1",
        reason="optional: the harness CLIs with a real small model through llama.cpp (make test-llm)",
    ),
    pytest.mark.skipif(
        not any(TOOLS_DIR.glob("harnesses-*/layer.json")),
        reason=f"no tools layer under {TOOLS_DIR} (make tools-layer)",
    ),
]

LIMITS = Limits(max_steps=3, max_seconds=300, command_timeout=60)
MODEL_GAVE_UP = {"openclaw": "fallback_exhausted"}
"""Harnesses that end ABORTED by their own verdict on this model's answers (see the doc)."""


@pytest.fixture(scope="module")
def real_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutStack]:
    home: Path = tmp_path_factory.mktemp("real-model-home")
    with (
        llama_server(["--chat_format", "chatml-function-calling", "--n_ctx", "8192"]) as base,
        running_stack(home, up_args=["--model-upstream", base]) as stack,
    ):
        yield RolloutStack(stack, PolicyServer(None, base))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(HARNESSES))
def test_a_real_harness_talks_to_a_real_model(real_stack: RolloutStack, name: str) -> None:
    async def body(client: AsyncOrchard, proxy: ModelProxyClient) -> None:
        task = replace(calc_task(), id=f"calc-real-{name}")
        result = await run_rollout(
            client, HARNESSES[name](), task, proxy=proxy, model="smollm2", limits=LIMITS,
            sandbox=SandboxOptions(memory="2Gi"),
        )  # fmt: skip
        calls = await proxy.calls(result.session_id or "")
        print(json.dumps({
            "harness": name, "status": str(result.status), "fault": result.fault,
            "steps": result.steps, "calls": len(calls),
            "statuses": [c.get("status") for c in calls],
            "errors": [str(c.get("error"))[:300] for c in calls if c.get("error")],
            "samples": len(result.samples),
            "prompt_tokens": [len(c.get("prompt_token_ids") or []) for c in calls],
        }))  # fmt: skip
        answered = [c for c in calls if c.get("status") == 200]
        assert answered, f"{name}: no call of the CLI was answered by the real server"
        assert len(result.samples) >= 1, f"{name}: the answered calls left no sample"
        if name in MODEL_GAVE_UP:
            assert result.status is not Status.ABORTED or MODEL_GAVE_UP[name] in (
                result.fault or ""
            ), result.fault
        else:
            assert result.status in (Status.COMPLETED, Status.TRUNCATED), result.fault

    real_stack.run(body)
