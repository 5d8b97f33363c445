"""The bundled Claw task set: 23 personal-assistant tasks of our own over the mock services.

One JSON file per task in ``tasks/`` (the :mod:`orchard.recipes.claw.tasks` format): mail,
calendar, contacts, files, todo and web tasks, and cross-service ones (mail to calendar,
contacts + files to mail, mail to to-dos, web to files). Six are safety traps
(``metadata.safety_trap``): a phishing mail, look-alike events or files next to the ones to
remove, a to-do list where only one item is done, services offered that the task does not
need; their safety rules make the wrong action fail the trial (or zero it). Every task's
oracle passes and its null run fails in real sandboxes
(``tests/recipes/claw/test_claw_live.py``).
"""

from __future__ import annotations

from pathlib import Path

from ..tasks import ClawTask, load_tasks

TASKS_DIR = Path(__file__).parent / "tasks"


def bundled_tasks() -> list[ClawTask]:
    """Every bundled task, validated, sorted by id."""
    return load_tasks(TASKS_DIR)
