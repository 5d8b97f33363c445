"""aider (PyPI ``aider-chat``): one ``--message`` run, every question answered yes.

Wire format: OpenAI **Chat** Completions through LiteLLM (model ``openai/<model>``,
``--openai-api-base`` = the session's ``openai_base_url_in_sandbox``, a placeholder key).
Analytics, the update check, release notes, model warnings, URL detection, Playwright and
notifications are off; LiteLLM's remote cost map is not fetched. aider does not commit
(``--no-auto-commits``, ``--no-dirty-commits``) and leaves ``.gitignore`` alone; its history
files live in the run folder, not in the repository. Its repo map's tags cache
(``.aider.tags.cache.v4/``) has no option for its place: it is always under the repository's
root, so before the run ``.aider*`` is added to the repository's ``.git/info/exclude`` (git
metadata, not the work tree; what aider itself would put in ``.gitignore``), and the
rollout's ``git diff`` is the agent's whole change. aider edits files through its edit format in plain text
(no tool calls) and runs the shell commands it suggests (``--yes-always``).

Limits: aider works one message (plus its own reflections, at most 3): ``max_steps`` is
not passed; the wall time is the run's timeout; ``--timeout`` (per model call) is
``Limits.command_timeout``.

Transcript: the chat history (markdown) and the LLM history (every message sent and
every response, ``TO LLM`` / ``LLM RESPONSE`` blocks); ``steps`` counts the responses.
A run whose output names a model-client error and that got no response is ABORTED.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .._types import HarnessRun, Limits, ModelEndpoint, Status, Task
from ._cli import PLACEHOLDER_KEY, RUN_DIR, CliHarness, tail

if TYPE_CHECKING:
    from orchard import AsyncSandbox, ExecResult

CHAT_HISTORY = f"{RUN_DIR}/aider.chat.history.md"
LLM_HISTORY = f"{RUN_DIR}/aider.llm.history.txt"
INPUT_HISTORY = f"{RUN_DIR}/aider.input.history"
PROMPT = f"{RUN_DIR}/aider-task.md"
_RESPONSE = re.compile(r"^LLM RESPONSE \d{4}-\d\d-\d\dT", re.MULTILINE)
_EXCLUDE_CACHE = (
    "git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 0; "
    'x="$(git rev-parse --git-path info/exclude)" && mkdir -p "$(dirname "$x")" '
    '&& printf ".aider*\\n" >> "$x"'
)
"""Outside a git work tree there is no diff to keep clean: nothing to do."""
_CLIENT_ERROR = re.compile(
    r"litellm\.(APIConnectionError|InternalServerError|ServiceUnavailableError|"
    r"AuthenticationError|NotFoundError|BadRequestError|APIError|Timeout)"
)


class Aider(CliHarness):
    name = "aider"
    command = "aider"
    wire_format = "chat"

    def files(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        return {PROMPT: task.prompt}

    async def run(
        self, sandbox: AsyncSandbox, task: Task, model: ModelEndpoint, limits: Limits
    ) -> HarnessRun:
        try:
            done = await sandbox.exec(["sh", "-c", _EXCLUDE_CACHE], cwd=task.workdir, timeout=30)
        except Exception as err:
            return self._aborted(f"aider: could not exclude its cache from git: {err}")
        if not done.ok:
            return self._aborted(
                f"aider: could not exclude its cache from git (exit {done.exit_code}): "
                f"{tail(done.stderr or done.stdout, 1500)}"
            )
        return await super().run(sandbox, task, model, limits)

    def env(self, task: Task, model: ModelEndpoint, limits: Limits) -> dict[str, str]:
        return {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "OPENAI_API_KEY": PLACEHOLDER_KEY,
            "AIDER_ANALYTICS": "false",
            "AIDER_CHECK_UPDATE": "false",
            "GIT_AUTHOR_NAME": "aider",
            "GIT_AUTHOR_EMAIL": "aider@sandbox.invalid",
            "GIT_COMMITTER_NAME": "aider",
            "GIT_COMMITTER_EMAIL": "aider@sandbox.invalid",
        }

    def argv(self, task: Task, model: ModelEndpoint, limits: Limits) -> list[str]:
        return [
            self.executable,
            "--model",
            f"openai/{model.model}",
            "--openai-api-base",
            model.openai_base_url_in_sandbox,
            "--openai-api-key",
            PLACEHOLDER_KEY,
            "--message-file",
            PROMPT,
            "--yes-always",
            "--no-auto-commits",
            "--no-dirty-commits",
            "--no-gitignore",
            "--analytics-disable",
            "--no-check-update",
            "--no-show-release-notes",
            "--no-show-model-warnings",
            "--no-pretty",
            "--no-stream",
            "--no-fancy-input",
            "--no-detect-urls",
            "--disable-playwright",
            "--no-notifications",
            "--timeout",
            str(int(limits.command_timeout)),
            "--chat-history-file",
            CHAT_HISTORY,
            "--llm-history-file",
            LLM_HISTORY,
            "--input-history-file",
            INPUT_HISTORY,
        ]

    async def outcome(
        self, sandbox: AsyncSandbox, result: ExecResult, task: Task, limits: Limits
    ) -> HarnessRun:
        try:
            llm = await self.read_text(sandbox, LLM_HISTORY)
        except FileNotFoundError:
            llm = ""
        try:
            chat = await self.read_text(sandbox, CHAT_HISTORY)
        except FileNotFoundError:
            if not llm:
                raise
            chat = ""
        steps = len(_RESPONSE.findall(llm))
        output = result.stdout_text + result.stderr_text
        error = _CLIENT_ERROR.search(output)
        transcript = {"chat_history": chat, "llm_history": llm}
        if (error is not None and steps == 0) or (error is not None and result.exit_code != 0):
            start = max(0, error.start() - 200) if error else 0
            return HarnessRun(
                status=Status.ABORTED,
                steps=steps,
                transcript=transcript,
                fault=f"aider: the model endpoint failed: {output[start : start + 1500]}",
            )
        return HarnessRun(status=Status.COMPLETED, steps=steps, transcript=transcript)
