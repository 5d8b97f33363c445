"""The verdict cache, keyed by (template name@version, model, inputs).

In memory, optionally backed by an append-only JSONL file so a restarted
service keeps its verdicts. Only real verdicts are cached, never failures.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cache_key(template_key: str, model: str, inputs: Mapping[str, str]) -> str:
    payload = json.dumps([template_key, model, dict(sorted(inputs.items()))], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


class VerdictCache:
    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._entries: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self._entries[row["key"]] = row["verdict"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn last line after a crash: skip it

    def get(self, key: str) -> dict[str, Any] | None:
        return self._entries.get(key)

    def put(self, key: str, verdict: dict[str, Any]) -> None:
        with self._lock:
            self._entries[key] = verdict
            if self._path is not None:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                with self._path.open("a") as f:
                    f.write(json.dumps({"key": key, "verdict": verdict}) + "\n")

    def __len__(self) -> int:
        return len(self._entries)
