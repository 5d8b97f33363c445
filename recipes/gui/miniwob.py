"""MiniWoB++ tasks: their names, how one is started and how it is scored.

The tasks are the HTML pages of PyPI ``miniwob`` (pinned in ``image.py``), copied into the
browser image (``/opt/orchard-gui/miniwob/miniwob/<name>.html``) and served by the
in-sandbox server on the sandbox's loopback. :data:`TASKS` lists every page of the pinned
wheel's ``html/miniwob`` folder (130; the FlightWoB pages are not included); the driver does
not need the ``miniwob`` package itself (it would pull Selenium and Gymnasium).

Started and scored as the ``miniwob`` package does (``selenium_instance.py``): load the
page, wait for the START cover (``#sync-task-cover``), optionally ``Math.seedrandom(seed)``,
call ``core.startEpisodeReal()``, wait for ``WOB_TASK_READY``; the instruction is
``core.getUtterance()``. The episode ends when the task's own JavaScript calls
``core.endEpisode(reward)``: ``WOB_DONE_GLOBAL`` becomes true and
``WOB_RAW_REWARD_GLOBAL`` holds the raw reward (+1 success, -1 failure; a few tasks give
partial credit in between), or MiniWoB times the episode out after ``core.EPISODE_MAX_TIME``
(10 s by default, a few tasks set more) with -1 and reason ``"timed out"``. A model that
thinks for seconds per step needs more: :attr:`MiniWoBTask.episode_seconds` overrides it.

:func:`succeeded` is the ground truth: done and a raw reward > 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchard.rollouts import Task

from .image import image_name

TASKS: tuple[str, ...] = (
    "ascending-numbers",
    "bisect-angle",
    "book-flight",
    "book-flight-nodelay",
    "button-delay",
    "buy-ticket",
    "chase-circle",
    "choose-date",
    "choose-date-easy",
    "choose-date-medium",
    "choose-date-nodelay",
    "choose-list",
    "circle-center",
    "click-button",
    "click-button-sequence",
    "click-checkboxes",
    "click-checkboxes-large",
    "click-checkboxes-soft",
    "click-checkboxes-transfer",
    "click-collapsible",
    "click-collapsible-2",
    "click-collapsible-2-nodelay",
    "click-collapsible-nodelay",
    "click-color",
    "click-dialog",
    "click-dialog-2",
    "click-link",
    "click-menu",
    "click-menu-2",
    "click-option",
    "click-pie",
    "click-pie-nodelay",
    "click-scroll-list",
    "click-shades",
    "click-shape",
    "click-tab",
    "click-tab-2",
    "click-tab-2-easy",
    "click-tab-2-hard",
    "click-tab-2-medium",
    "click-test",
    "click-test-2",
    "click-test-transfer",
    "click-widget",
    "copy-paste",
    "copy-paste-2",
    "count-shape",
    "count-sides",
    "daily-calendar",
    "drag-box",
    "drag-circle",
    "drag-cube",
    "drag-items",
    "drag-items-grid",
    "drag-shapes",
    "drag-shapes-2",
    "drag-single-shape",
    "drag-sort-numbers",
    "draw-circle",
    "draw-line",
    "email-inbox",
    "email-inbox-delete",
    "email-inbox-forward",
    "email-inbox-forward-nl",
    "email-inbox-forward-nl-turk",
    "email-inbox-important",
    "email-inbox-nl-turk",
    "email-inbox-noscroll",
    "email-inbox-reply",
    "email-inbox-star-reply",
    "enter-date",
    "enter-password",
    "enter-text",
    "enter-text-2",
    "enter-text-dynamic",
    "enter-time",
    "find-greatest",
    "find-midpoint",
    "find-word",
    "focus-text",
    "focus-text-2",
    "form-sequence",
    "form-sequence-2",
    "form-sequence-3",
    "generate-number",
    "grid-coordinate",
    "guess-number",
    "highlight-text",
    "highlight-text-2",
    "hot-cold",
    "hover-shape",
    "identify-shape",
    "login-user",
    "login-user-popup",
    "moving-items",
    "multi-layouts",
    "multi-orderings",
    "navigate-tree",
    "number-checkboxes",
    "odd-or-even",
    "order-food",
    "phone-book",
    "read-table",
    "read-table-2",
    "resize-textarea",
    "right-angle",
    "scroll-text",
    "scroll-text-2",
    "search-engine",
    "sign-agreement",
    "simon-says",
    "simple-algebra",
    "simple-arithmetic",
    "social-media",
    "social-media-all",
    "social-media-some",
    "stock-market",
    "terminal",
    "text-editor",
    "text-transform",
    "tic-tac-toe",
    "unicode-test",
    "use-autocomplete",
    "use-autocomplete-nodelay",
    "use-colorwheel",
    "use-colorwheel-2",
    "use-slider",
    "use-slider-2",
    "use-spinner",
    "visual-addition",
)
_TASK_SET = frozenset(TASKS)

# Tasks a scripted policy over ``Observation.elements`` solves (tests/recipes/gui): clicks on
# text, checkboxes by label, typing into a field.
SCRIPTED = ("click-button", "click-link", "click-checkboxes", "enter-text", "focus-text")


@dataclass(frozen=True)
class MiniWoBTask:
    """One MiniWoB++ episode to run: the task ``name``, an optional ``seed`` (the page's
    ``Math.seedrandom``) and ``episode_seconds`` (None: the task's own time limit)."""

    name: str
    seed: int | None = None
    episode_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.name not in _TASK_SET:
            raise ValueError(f"unknown MiniWoB task {self.name!r} (see miniwob.TASKS)")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise ValueError("seed must be an int or None")
        if self.episode_seconds is not None and not 0 < self.episode_seconds <= 3600:
            raise ValueError("episode_seconds must be in (0, 3600]")

    @property
    def task_id(self) -> str:
        """``miniwob/<name>`` (with ``@<seed>`` when seeded): stable across runs."""
        return f"miniwob/{self.name}" + ("" if self.seed is None else f"@{self.seed}")


def succeeded(task_reward: float | None) -> bool:
    """MiniWoB's success signal: the episode ended with a raw reward > 0."""
    return task_reward is not None and task_reward > 0


def rollout_task(name: str, seed: int | None = None, episode_seconds: float | None = None) -> Task:
    """The ``orchard.rollouts.Task`` of one MiniWoB episode: the browser image, no files or
    setup (``BrowserEnv.start`` uploads and starts the server), the episode in ``metadata``
    (:func:`task_from_metadata` reads it back). ``prompt`` is empty: the instruction is
    generated by the page at reset (``Observation.utterance``)."""
    task = MiniWoBTask(name, seed, episode_seconds)
    return Task(
        id=task.task_id,
        prompt="",
        image=image_name(),
        workdir="/tmp",
        metadata={"miniwob": name, "seed": seed, "episode_seconds": episode_seconds},
    )


def task_from_metadata(metadata: Mapping[str, Any]) -> MiniWoBTask:
    """The :class:`MiniWoBTask` a :func:`rollout_task`'s metadata names (ValueError if none)."""
    name = metadata.get("miniwob")
    if not isinstance(name, str):
        raise ValueError("the task's metadata names no MiniWoB task ('miniwob')")
    seconds = metadata.get("episode_seconds")
    return MiniWoBTask(name, metadata.get("seed"), None if seconds is None else float(seconds))
