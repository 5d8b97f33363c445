"""claw-bench's tasks as Claw tasks (:class:`orchard.recipes.claw.tasks.ClawTask`).

A claw-bench task has no mock service: it works on files in a workspace, so its Claw task has
``fixtures=None`` (the ReAct loop then offers ``bash``), its ``category`` is claw-bench's
domain, and the three parts claw-bench ships map onto the format's script kinds:

- ``environment``: the task's ``environment/`` folder as files, and its setup commands
  (:func:`.layout.setup_commands`), in the default image (``image`` None);
- ``oracle``: a :class:`~orchard.recipes.claw.tasks.ScriptOracle`, ``solve.sh`` written and run;
- ``grader``: a :class:`~orchard.recipes.claw.tasks.ScriptGrader` whose files (the verifier,
  the root ``conftest.py``, the score script) are written only at grading time, and whose last
  output line is ``{"score": checks passed / checks run, "components": {test: 0|1}}``.

``metadata`` keeps where the task came from (``claw_bench``: version, folder, level, title).
:func:`claw_tasks` gives the tasks the checked-in triage accepts (the default) or every
readable one; an accepted id the installed claw-bench does not have is an error, not a gap.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..tasks import Base64File, ClawTask, Environment, FileContent, ScriptGrader, ScriptOracle
from .layout import (
    VERIFIER_TIMEOUT,
    WORKSPACE,
    environment_files,
    oracle_command,
    prompt,
    setup_commands,
    verifier_command,
    verifier_files,
)
from .source import BenchTask, Catalogue, load_catalogue
from .triage_file import accepted_ids

ORACLE_TIMEOUT = 300.0
SOURCE = "claw-bench"


class StaleTriageError(RuntimeError):
    """The checked-in triage names tasks the installed claw-bench does not ship."""


def _content(data: bytes) -> FileContent:
    try:
        return data.decode()
    except UnicodeDecodeError:
        import base64

        return Base64File(base64=base64.b64encode(data).decode())


def to_claw_task(task: BenchTask, version: str) -> ClawTask:
    """The Claw task of one claw-bench task (validated by the format's own models)."""
    return ClawTask(
        id=task.id,
        category=task.domain,
        prompt=prompt(task),
        fixtures=None,
        environment=Environment(
            image=None,
            workdir=WORKSPACE,
            files={p: _content(b) for p, b in environment_files(task).items()},
            setup=setup_commands(task),
        ),
        grader=ScriptGrader(
            command=verifier_command(task),
            files={p: _content(b) for p, b in verifier_files(task).items()},
            workdir=WORKSPACE,
            timeout=VERIFIER_TIMEOUT + 60,
        ),
        oracle=ScriptOracle(
            command=oracle_command(task), workdir=WORKSPACE, timeout=ORACLE_TIMEOUT
        ),
        metadata={
            "source": SOURCE,
            "claw_bench": {
                "version": version,
                "folder": task.rel,
                "level": task.level,
                "title": task.title,
                "timeout": task.timeout,
            },
        },
    )


def claw_tasks(
    catalogue: Catalogue | None = None,
    *,
    accepted_only: bool = True,
    only: Sequence[str] = (),
) -> list[ClawTask]:
    """The claw-bench tasks as Claw tasks: those the checked-in triage accepts (or every
    readable one with ``accepted_only=False``), in claw-bench's order; ``only`` picks ids."""
    catalogue = catalogue or load_catalogue()
    by_id = catalogue.by_id()
    if accepted_only:
        wanted = accepted_ids()
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise StaleTriageError(
                f"the triage accepts {', '.join(missing)}, which claw-bench "
                f"{catalogue.version} does not ship: re-run `check --write-triage`"
            )
        keep = set(wanted)
    else:
        keep = set(by_id)
    if only:
        unknown = sorted(set(only) - keep)
        if unknown:
            raise KeyError(f"not {'accepted ' if accepted_only else ''}claw-bench tasks: "
                           f"{', '.join(unknown)}")  # fmt: skip
        keep &= set(only)
    return [to_claw_task(t, catalogue.version) for t in catalogue.tasks if t.id in keep]
