"""Fixtures of the Claw services' tests: ``box``, the services as a host process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .box_process import BoxProcess, box_process
from .sample_fixtures import sample_fixtures


@pytest.fixture
def box(tmp_path: Path) -> Iterator[BoxProcess]:
    """The services with every sample fixture, the files root under ``tmp_path/files``."""
    with box_process() as process:
        process.reset(sample_fixtures(tmp_path / "files").wire())
        yield process
