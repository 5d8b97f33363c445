"""``make test``'s two phases, and how the parallel one hands out its files.

``scripts/run_tests.sh`` runs pytest twice (docs/testing.md, "The suite's phases"):

1. ``ORCHARD_TEST_PHASE=serial``: only the tests marked ``serial``, one at a time, on a
   quiet machine: they start hundreds of sandboxes under the machine-wide heavy lock,
   measure one sandbox's latency beside another's (a neighbour's load would be theirs),
   or change the host's routes (the fake internet, tests/network/conftest.py).
2. ``ORCHARD_TEST_PHASE=parallel``: everything else under pytest-xdist (``-n N --dist
   loadfile``). Without the variable (a plain ``pytest``) nothing is deselected.

The parallel phase's unit of work is a test *file* (``--dist loadfile``): most live modules
start one ``orchard up`` per module (a module-scoped fixture), and splitting a file across
workers would start it once per worker. Files that must not run at the same time as each
other (they share files in the checkout) are listed together in :data:`GROUPS` and become
one unit: one worker runs them in a row.
Units are handed out longest first, by the seconds each took in an earlier run
(:data:`DURATIONS`, ``tests/durations.json``), so a long file does not start last and hold
the run up alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

PHASES = ("serial", "parallel")
PHASE_VARIABLE = "ORCHARD_TEST_PHASE"


def current_phase() -> str | None:
    """The phase this pytest runs (``None``: no phase, nothing deselected)."""
    value = os.environ.get(PHASE_VARIABLE, "")
    if not value:
        return None
    if value not in PHASES:
        raise pytest.UsageError(f"{PHASE_VARIABLE}={value!r}: expected one of {', '.join(PHASES)}")
    return value


class PhaseSelection:
    """Deselects the tests of the other phase (reported as deselected, never dropped)."""

    def __init__(self, phase: str) -> None:
        self.phase = phase

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        keep: list[pytest.Item] = []
        drop: list[pytest.Item] = []
        for item in items:
            serial = item.get_closest_marker("serial") is not None
            (keep if serial == (self.phase == "serial") else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_report_header(self) -> str:
        return f"orchard test phase: {self.phase}"


GROUPS: dict[str, tuple[str, ...]] = {
    # One wheel built in the checkout's build/, venvs cached under build/test-venvs.
    "install": ("tests/install/",),
}
"""Files that one worker runs one after another: a folder ends with ``/``."""


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """The parallel phase's unit of a test: its group in :data:`GROUPS`, or else its file."""
    path = file_of(nodeid)
    for name, members in GROUPS.items():
        if any(path == m or (m.endswith("/") and path.startswith(m)) for m in members):
            return f"group:{name}"
    return path


DURATIONS = Path(__file__).with_name("durations.json")
"""Seconds per unit from an earlier run (``scripts/durations.py`` writes it)."""
UNKNOWN_SECONDS_PER_TEST = 1.0
"""A unit :data:`DURATIONS` does not know (a new file) counts this much per test."""


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """The recorded seconds per unit; empty without the file. A malformed file is an error
    (it would silently order the run badly otherwise)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as err:
        raise pytest.UsageError(f"{path}: not JSON ({err}); regenerate it") from err
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) for k, v in data.items()
    ):
        raise pytest.UsageError(f"{path}: expected {{unit: seconds}}; regenerate it")
    return {k: float(v) for k, v in data.items()}


class FileOrGroupScheduler:
    """xdist's ``loadfile`` with :data:`GROUPS` (module docstring), longest unit first.

    Not xdist's ``xdist_group`` marks: xdist 3.8 puts the group into ``item._nodeid``,
    which pytest 9.2 no longer reads (its ``nodeid`` comes from ``_id``), so under
    ``--dist loadgroup`` every test became its own unit and the groups were lost.
    """

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: object) -> object | None:
        if config.getvalue("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-not-found,unused-ignore]

        durations = load_durations()

        class FileOrGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
            def _split_scope(self, nodeid: str) -> str:
                return unit_of(nodeid)

            def _assign_work_unit(self, node: object) -> None:
                # Longest first (by the last run's seconds), so no long file starts last
                # and holds the run up alone; xdist then pops the queue's head.
                def seconds(unit: str) -> float:
                    known = durations.get(unit)
                    if known is not None:
                        return known
                    return len(self.workqueue[unit]) * UNKNOWN_SECONDS_PER_TEST

                self.workqueue.move_to_end(max(self.workqueue, key=seconds), last=False)
                super()._assign_work_unit(node)

        return FileOrGroupScheduling(config, log)


def register(config: pytest.Config) -> None:
    """Called from tests/conftest.py's ``pytest_configure``."""
    phase = current_phase()
    if phase is not None:
        config.pluginmanager.register(PhaseSelection(phase), "orchard-test-phase")
    # A side venv's pytest (tests/integrations/side_venv.py) has no xdist.
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(FileOrGroupScheduler(), "orchard-file-or-group")
