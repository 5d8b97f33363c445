"""claw-bench's tasks (PyPI ``claw-bench``) on the Claw runner: loaded from the installed wheel,
converted to Claw tasks, checked in real sandboxes, sorted into accepted and refused.

- :mod:`.source`: the wheel's task folders, each read whole or said to be malformed;
- :mod:`.layout`: where a task lives in a sandbox, the setup, oracle and verifier commands;
- :mod:`.convert`: a claw-bench task as a :class:`~orchard.recipes.claw.tasks.ClawTask`;
- :mod:`.check` and :mod:`.triage`: reference and null runs through the Claw runner, and the
  verdict on each task with its reason; :mod:`.triage_file`: the checked-in ``triage.json``;
- :mod:`.cli`: ``python -m orchard.recipes.claw.clawbench list | check | triage | export``.

We use claw-bench's own parser (``claw_bench.core.task_loader.load_task``) and run its
scripts unchanged; its runner is not used, because it runs the agent's work on the host
(``run_single_task`` has no sandbox) and its oracle cannot find the solutions of an installed
wheel (``DryRunAdapter`` looks for ``solve.sh`` under the workspace). See
``docs/recipes/claw-bench.md``.
"""

from .convert import claw_tasks, to_claw_task
from .source import BenchTask, Catalogue, Malformed, load_catalogue

__all__ = ["BenchTask", "Catalogue", "Malformed", "claw_tasks", "load_catalogue", "to_claw_task"]
