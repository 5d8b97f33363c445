"""The executor's per-sandbox memo tables stay bounded across create/delete churn.

A 20-minute soak (39k create -> delete cycles) grew the executor by ~85 MiB
while these tables kept an entry for every sandbox ever called; they now drop
their oldest entries past a bound.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from orchard.executor import sandboxes

from orchard.common.errors import ServiceError
from orchard.common.layout import NodeLayout


def test_remembered_paths_stay_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandboxes, "MAX_REMEMBERED_SANDBOXES", 16)
    directory = sandboxes.SandboxDirectory(NodeLayout(tmp_path))
    for n in range(200):
        with pytest.raises(ServiceError):  # no sandbox.json: NOT_FOUND, but looked up
            directory.get(f"sb-{n:012x}")
    assert 0 < len(directory._paths) <= 16
    assert "sb-0000000000c7" in directory._paths  # the newest is kept
    assert "sb-000000000000" not in directory._paths  # the oldest went first


def test_drop_oldest_keeps_insertion_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandboxes, "MAX_REMEMBERED_SANDBOXES", 3)
    entries: dict[str, object] = {}
    for key in "abcde":
        sandboxes._drop_oldest(entries)
        entries[key] = key
    assert list(entries) == ["c", "d", "e"]
