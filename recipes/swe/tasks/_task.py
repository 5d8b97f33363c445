"""One normalized SWE task, whatever dataset it came from, and its two uses.

:meth:`SweTask.rollout_task` is what :mod:`orchard.rollouts` runs an agent on;
:meth:`SweTask.grading_instance` is the row the rewards service's SWE grader takes
(``GradeRequest.instance_json`` in ``protos/orchard/v1/rewards.proto``: the fields its
``parse_instance`` reads: ``instance_id, image, workdir, install_config{test_cmd,
log_parser}, FAIL_TO_PASS, PASS_TO_PASS, test_patch, pre_commands, repo_files`` ...).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchard.rollouts import Task

PROMPT = """\
You are working in the repository at {workdir}. Resolve this issue:

{problem_statement}

Edit the source files (not the tests) so the issue is fixed. When you are done, say so."""


class TaskNotGradable(ValueError):
    """The task lacks what grading needs (a test command); the message says what and why."""


@dataclass(frozen=True)
class SweTask:
    instance_id: str
    dataset: str
    """The row format it was read as (``swe-bench``, ``swe-rebench-v2``, ``orchard`` ...)."""
    problem_statement: str
    image: str
    workdir: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_patch: str
    gold_patch: str = ""
    repo: str = ""
    base_commit: str = ""
    version: str = ""
    test_cmd: tuple[str, ...] = ()
    """Empty: the row does not say how to run its tests (SWE-bench rows without the
    ``swebench`` package's specs, SWE-Gym); :meth:`grading_instance` refuses it."""
    log_parser: str = ""
    """Empty: the rewards service picks one from ``repo`` (swebench's own map), else pytest."""
    pre_commands: tuple[str, ...] = ()
    repo_files: Mapping[str, str] = field(default_factory=dict)
    """Files (relative to ``workdir``) an image without the repository is given, committed
    as the base (the bundled tasks; the rewards service's ``repo_files`` extension)."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """The row's other fields (hints, dates, difficulty, provenance), as they were."""

    @property
    def gradable(self) -> bool:
        return bool(self.test_cmd)

    def grading_instance(self) -> dict[str, Any]:
        """The instance row for ``Rewards.grade`` (its ``instance_json``)."""
        if not self.test_cmd:
            raise TaskNotGradable(
                f"{self.instance_id}: no test command: {self.dataset} rows do not carry one"
                + (
                    " (SWE-bench rows take it from the swebench package's specs for the repo"
                    f" and version; none for {self.repo!r} {self.version!r})"
                    if self.dataset.startswith("swe-bench")
                    else ""
                )
                + "; pass test_cmd= to load_tasks"
            )
        row: dict[str, Any] = {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "base_commit": self.base_commit,
            "version": self.version,
            "image": self.image,
            "workdir": self.workdir,
            "test_patch": self.test_patch,
            "FAIL_TO_PASS": list(self.fail_to_pass),
            "PASS_TO_PASS": list(self.pass_to_pass),
            "install_config": {"test_cmd": list(self.test_cmd)},
            "pre_commands": list(self.pre_commands),
        }
        if self.log_parser:
            row["install_config"]["log_parser"] = self.log_parser
        if self.repo_files:
            row["repo_files"] = dict(self.repo_files)
        return row

    def grading_json(self) -> str:
        return json.dumps(self.grading_instance())

    def rollout_task(self, prompt: str = PROMPT) -> Task:
        """The task for :func:`orchard.rollouts.run_rollout`: the issue as the prompt, the
        image, the work directory; for an image without the repository, its files and a
        setup that commits them (so the rollout's final ``git diff`` is the agent's change)."""
        files = {
            f"{self.workdir.rstrip('/')}/{path}": text.encode()
            for path, text in self.repo_files.items()
        }
        setup: tuple[str, ...] = ()
        if self.repo_files:
            setup = (
                f"cd {shlex.quote(self.workdir)} && git init -q && git add -A && "
                "git -c user.name=orchard -c user.email=orchard@localhost commit -qm base",
            )
        return Task(
            id=self.instance_id,
            prompt=prompt.format(
                workdir=self.workdir, problem_statement=self.problem_statement.strip()
            ),
            image=self.image,
            workdir=self.workdir,
            files=files,
            setup=setup,
            metadata={
                "dataset": self.dataset,
                "repo": self.repo,
                "base_commit": self.base_commit,
                "fail_to_pass": list(self.fail_to_pass),
                "pass_to_pass": list(self.pass_to_pass),
                **self.metadata,
            },
        )
