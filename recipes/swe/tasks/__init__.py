"""SWE task sets: loaders for the public row formats and the bundled real-bug tasks.

``load_tasks(path, "swe-rebench-v2")`` reads a local JSONL / JSON / Parquet export of a
dataset into :class:`SweTask` s (each row validated; a bad one raises
:class:`TaskRowError` naming file, row and field). A task gives the rollout runner its
:class:`orchard.rollouts.Task` (:meth:`SweTask.rollout_task`) and the rewards service its
instance row (:meth:`SweTask.grading_instance`).
"""

from ._formats import FORMATS, new_file_patch, patch_files
from ._images import swe_gym_image, swebench_image
from ._load import TaskRowError, iter_tasks, load_tasks, parse_row, read_rows
from ._task import PROMPT, SweTask, TaskNotGradable

__all__ = [
    "FORMATS",
    "PROMPT",
    "SweTask",
    "TaskNotGradable",
    "TaskRowError",
    "iter_tasks",
    "load_tasks",
    "new_file_patch",
    "parse_row",
    "patch_files",
    "read_rows",
    "swe_gym_image",
    "swebench_image",
]
