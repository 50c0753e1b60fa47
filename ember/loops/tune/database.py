"""The tuning database: one JSON file (the driver's is tuning.json in the cache folder),
mapping a kernel key (its class, shapes, dtypes, the target and thread count) to the
winning schedule's parameters and its measured time. Writes are atomic (a temp file
renamed)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from ember.util.files import write_atomically


class TuningDatabase:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lock = threading.Lock()
        self.entries: dict[str, dict[str, Any]] = {}
        try:
            loaded = json.loads(self.path.read_text())
            if isinstance(loaded, dict):
                self.entries = loaded
        except (OSError, ValueError):
            pass  # missing or damaged: start empty (a damaged file is replaced on write)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, key: str, record: dict[str, Any]) -> None:
        with self.lock:
            self.entries[key] = record
            write_atomically(self.path, json.dumps(self.entries, indent=1, sort_keys=True))
