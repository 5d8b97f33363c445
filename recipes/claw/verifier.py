"""Running a script grader's verifier (claw-bench's verifier tests) for one trial.

By default in a **fresh sandbox**, not the agent's: a reward must come from evidence the
agent cannot forge, and in its own sandbox an agent that can write anywhere could plant a
``sitecustomize.py``, patch the test runner or leave a passing result where the verifier
writes. So (``ScriptGrader.isolated``, the default): the agent's working folder is
downloaded; a new sandbox of the task's image (network ``none``) gets the task's files and
setup as before the agent ran, then the agent's working folder in place of its own, then the
verifier's files (written last: they win over anything the agent left at their paths); the
command runs there and the sandbox is deleted. What the agent changed outside its working
folder is not carried over (the verifier judges the work, not the machine). A verifier that
must see the agent's whole sandbox says ``"isolated": false``.

A failure of this machinery (a create, a download, a setup that fails now) raises: the grade
hook turns it into an ABORTED trial (infrastructure), never a score.
"""

from __future__ import annotations

import contextlib
import tempfile
from typing import TYPE_CHECKING

import orchard

from .grading import GradingError, VerifierOutcome
from .tasks import ClawTask, ScriptGrader, file_bytes

if TYPE_CHECKING:
    from orchard import AsyncSandbox
    from orchard.rollouts import SandboxOptions

MAX_OUTPUT = 20_000


async def _run(sandbox: AsyncSandbox, spec: ScriptGrader) -> VerifierOutcome:
    for path, content in spec.files.items():
        await sandbox.write_file(path, file_bytes(content))
    await sandbox.make_dir(spec.workdir, parents=True)
    done = await sandbox.exec(["sh", "-c", "exec 2>&1\n" + spec.command], cwd=spec.workdir,
                              timeout=spec.timeout)  # fmt: skip
    output = (done.stdout + done.stderr).decode("utf-8", "replace")
    return VerifierOutcome(done.exit_code, output[-MAX_OUTPUT:], done.timed_out)


async def _prepare(fresh: AsyncSandbox, task: ClawTask, setup_timeout: float) -> None:
    env = task.environment
    for path, content in env.files.items():
        await fresh.write_file(path, file_bytes(content))
    await fresh.make_dir(env.workdir, parents=True)
    for command in env.setup:
        done = await fresh.exec(["sh", "-c", command], cwd=env.workdir, timeout=setup_timeout)
        if done.exit_code != 0 or done.timed_out:
            tail = (done.stderr_text or done.stdout_text)[-1000:].strip()
            raise GradingError(
                f"verifier sandbox: setup {command!r} exited {done.exit_code}: {tail}"
            )


async def run_verifier(
    client: orchard.AsyncOrchard,
    agent_box: AsyncSandbox,
    task: ClawTask,
    options: SandboxOptions | None = None,
    setup_timeout: float = 900.0,
) -> VerifierOutcome:
    """The verifier's outcome for the trial the agent left in ``agent_box`` (see above)."""
    spec = task.grader
    if not isinstance(spec, ScriptGrader):
        raise GradingError(f"task {task.id}: not a script grader")
    if not spec.isolated:
        return await _run(agent_box, spec)
    workdir = task.environment.workdir
    image = (options.image if options is not None else None) or task.environment.image
    memory = options.memory if options is not None else None
    with tempfile.TemporaryDirectory(prefix="claw-verify-") as local:
        await agent_box.download(workdir, local)
        fresh = await client.sandboxes.create(
            image=image, memory=memory, network="none", ttl=3600.0,
            labels={"orchard.recipes.claw/verifier-of": agent_box.id},
        )  # fmt: skip
        try:
            await _prepare(fresh, task, setup_timeout)
            await fresh.remove(workdir, recursive=True)
            await fresh.make_dir(workdir, parents=True)
            await fresh.upload(local, workdir)
            return await _run(fresh, spec)
        finally:
            with contextlib.suppress(orchard.OrchardError):
                await fresh.delete()
