"""NeMo Gym (PyPI ``nemo-gym``) runs its sandboxes on Orchard through its own provider API.

nemo-gym 0.7 asks for Python >= 3.13.14 and the suite runs on 3.11, so it lives in
``.venv-nemo-gym`` (``make nemo-gym-venv``, run by ``make test``; the newest CPython
here is 3.13.0, so it is installed with --ignore-requires-python, and without the
training-stack dependencies that ``nemo_gym.sandbox`` does not import: see the
Makefile). ``nemo_gym_checks.py`` runs there against this module's stack.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import REQUIRES_STACK, Stack, running_stack

from .side_venv import ROOT, requires_venv, run_checks

NEMO_GYM_VENV = ROOT / ".venv-nemo-gym"

pytestmark = [*REQUIRES_STACK, requires_venv(NEMO_GYM_VENV, "nemo-gym-venv")]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("nemo-gym") / "home") as running:
        yield running


def test_the_provider_under_nemo_gyms_sandbox_api(stack: Stack) -> None:
    run_checks(NEMO_GYM_VENV, Path(__file__).parent / "nemo_gym_checks.py", stack)
